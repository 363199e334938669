"""Any valid batch split gives the full mini-batch's gradient, and both step modes the same update.

Hypothesis draws several splits (rollout.n, mini-batch, fixed or token-budget micro-batches,
loss aggregation, ZeRO stage, lengths); one spawned rank pair runs all of them (start-up is
the expensive part). For each split the accumulated gradient of the first mini-batch is read
from DeepSpeed (``safe_get_full_grad``, just before the optimizer step) and compared with the
gradient of the whole mini-batch in one process; the weights after the update call are
compared with the reference, and the two step modes with each other.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.distributed.workers.helpers import (
    ZERO3_PARTITION_ALL,
    Reference,
    global_mini_batches,
    make_cfg,
    make_model_dir,
    make_step_batch,
    max_abs_diff,
    params_of,
    shard,
)
from tests.strategies import worker_batch_splits

TOL = 1e-5
EXAMPLES = 3


def _cfg(model_dir: str, ex: dict, world: int, step_each_micro: bool):
    return make_cfg(model_dir, world=world, stage=ex["stage"], n=ex["n"], train_batch_size=ex["train_batch_size"],
                    mini=ex["mini"], micro=ex["micro"], dynamic=ex["dynamic"], max_tokens=ex["max_tokens"],
                    loss_agg_mode=ex["loss_agg_mode"], step_each_micro=step_each_micro, grad_clip=0.0)


def _run_splits(rank: int, world: int, model_dir: str, examples: list[dict]) -> list[dict]:
    from deepspeed.utils import safe_get_full_grad

    from repro.workers.actor import ActorWorker

    results = []
    for ex in examples:
        per_mode = {}
        for step_each_micro in (False, True):
            cfg = _cfg(model_dir, ex, world, step_each_micro)
            worker = ActorWorker(cfg, ds_overrides=ZERO3_PARTITION_ALL if ex["stage"] == 3 else None)
            grads: dict[str, torch.Tensor] = {}

            def probe(engine, grads=grads) -> None:
                if grads:  # the first mini-batch only
                    return
                for name, p in engine.module.named_parameters():
                    grads[name] = safe_get_full_grad(p).detach().float().cpu().clone()

            worker.engine.before_step = probe
            batch = make_step_batch(ex["seed"], ex["train_batch_size"] * ex["n"])
            metrics = worker.update_policy(shard(batch, rank, world))
            per_mode[step_each_micro] = {"grads": grads, "params": params_of(worker), "metrics": metrics}
        results.append(per_mode)
    return results


def _check(model_dir: str, examples: list[dict], results: list[list[dict]], world: int) -> None:
    for i, ex in enumerate(examples):
        out = results[0][i]
        ref = Reference(_cfg(model_dir, ex, world, False), "actor")
        batch = make_step_batch(ex["seed"], ex["train_batch_size"] * ex["n"])
        per_rank_mini = ex["mini"] * ex["n"] // world
        minis = global_mini_batches(batch, world, per_rank_mini)
        full_grad = ref.grads(minis[0])
        for mini in minis:
            ref.update(mini)
        for mode in (False, True):
            assert max_abs_diff(out[mode]["grads"], full_grad) < TOL, (ex, mode, "gradient")
            assert max_abs_diff(out[mode]["params"], ref.params()) < TOL, (ex, mode, "weights")
            assert out[mode]["metrics"]["actor/num_updates"] == len(minis)
        assert max_abs_diff(out[False]["params"], out[True]["params"]) == 0.0, (ex, "step modes differ")


def _split_test(world: int, multirank, tmp_path, examples: list[dict]) -> None:
    model_dir = make_model_dir(tmp_path / "model")
    results = multirank(_run_splits, world, timeout_s=120, args=(model_dir, examples))
    _check(model_dir, examples, results, world)


@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(examples=st.lists(worker_batch_splits(dp=2), min_size=EXAMPLES, max_size=EXAMPLES))
def test_any_split_on_two_ranks_accumulates_the_full_mini_batch_gradient(examples, multirank, tmp_path):
    _split_test(2, multirank, tmp_path, examples)


@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(examples=st.lists(worker_batch_splits(dp=1), min_size=EXAMPLES, max_size=EXAMPLES))
def test_any_split_on_one_rank_accumulates_the_full_mini_batch_gradient(examples, multirank, tmp_path):
    _split_test(1, multirank, tmp_path, examples)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_uneven_token_budget_micro_batches_match_reference(stage, multirank, tmp_path):
    # Fixed example: very uneven lengths and an empty response, token budget packing.
    ex = {"n": 2, "mini": 4, "train_batch_size": 4, "micro": None, "dynamic": True, "max_tokens": 13,
          "loss_agg_mode": "token-mean", "stage": stage, "seed": 5}
    _split_test(2, multirank, tmp_path, [ex])
