"""Layouts give the same step: step 1 of the actor in every layout, against the same step on one rank.

One table (``LAYOUTS``): ZeRO-1/2/3 at dp=2, Ulysses sp=2, fixed and token-budget micro-batches,
padded and packed (remove-padding) rows, each on 2 gloo ranks of the warm rank pool; the
baseline is the same ``ActorWorker`` on one rank, padded, fixed micro-batches. Compared: the
step's entropy (what the trainer reports from ``compute_log_prob``), its policy and KL losses
(the ranks' metrics reduced as the driver reduces them) and DeepSpeed's grad norm, each within a
bound derived below. Every layout runs in the same two rank processes (one pool task; the
baseline is a second, one-rank task), so the table costs two engine builds' start-up, not one per
row. Each row also reads back that it ran the layout it names (``RoleEngine.report``: ZeRO stage,
SP group, mask-free packed rows), so a layout silently falling back to another cannot pass.

This module is the one place where layouts are compared with each other at step 1 (it replaces
the bare-DeepSpeed ZeRO-1/2/3 loss and grad-norm smoke test); the deeper per-feature checks stay
with their features (every gradient element, later steps, the weights: ``test_zero_parity.py``,
``test_remove_padding.py``, ``test_ulysses.py``, ``test_batch_splits.py``).
"""

from __future__ import annotations

import math

import torch

from repro.data.tiny_model import TOY_VOCAB
from repro.rl.metrics import reduce_rank_metrics
from tests.distributed.workers.helpers import (
    ZERO3_PARTITION_ALL,
    fp32_tol,
    make_cfg,
    make_model_dir,
    make_step_batch,
    shard,
    toy_chain,
)

SAMPLES = 8  # train_batch_size 4 x n 2: one mini-batch, so step 1 is one optimizer update
SEQ = 12  # make_step_batch: prompt 6 + response 6
# Seed 58: on each rank two samples of a micro-batch fit one packed row (real lengths 4 + 8 and
# 5 + 6 of 12), so the packed layouts really put samples side by side in a row (read back below).
SEED = 58
EMPTY = (5,)  # one sample with an empty response: a micro-batch or packed row may hold no loss token
# name -> ZeRO stage, sp, token budget per rank (None: fixed micro-batches of 2), remove-padding
LAYOUTS = {
    "zero1 dp2": {"stage": 1},
    "zero2 dp2": {"stage": 2},
    "zero3 dp2": {"stage": 3},
    "zero2 dp2 token budget": {"stage": 2, "budget": 14},
    "zero3 dp2 token budget": {"stage": 3, "budget": 14},
    "zero2 dp2 remove-padding": {"stage": 2, "rmpad": True},
    "zero3 dp2 remove-padding token budget": {"stage": 3, "rmpad": True, "budget": 14},
    "zero2 sp2": {"stage": 2, "sp": 2},
    "zero3 sp2 remove-padding": {"stage": 3, "sp": 2, "rmpad": True},
    "zero1 sp2 token budget": {"stage": 1, "sp": 2, "budget": 10},
}
ONE_RANK = {"stage": 1}
LOSS_KEYS = ("actor/pg_loss", "actor/kl_loss")


def _batch() -> dict[str, torch.Tensor]:
    return make_step_batch(SEED, SAMPLES, empty_rows=EMPTY)


def _worker(model_dir: str, world: int, layout: dict):
    from repro.workers.actor import ActorWorker

    budget = layout.get("budget")
    cfg = make_cfg(model_dir, world=world, stage=layout["stage"], mini=4, micro=2, dynamic=budget is not None,
                   max_tokens=budget or 64, use_kl_loss=True, entropy_coeff=0.01)
    arr = cfg.actor_rollout_ref
    arr.actor.ulysses_sequence_parallel_size = layout.get("sp", 1)
    arr.model.use_remove_padding = layout.get("rmpad", False)
    arr.rollout.log_prob_use_dynamic_bsz = budget is not None
    arr.rollout.log_prob_max_token_len_per_gpu = budget or 64
    return ActorWorker(cfg, ds_overrides=ZERO3_PARTITION_ALL if layout["stage"] == 3 else None)


def _step_one(rank: int, world: int, model_dir: str, layouts: list[dict]) -> list[dict]:
    """Per layout, on this rank: step 1's per-token entropy of its rows, its update metrics, the read-back."""
    out = []
    batch = shard(_batch(), rank, world)
    for layout in layouts:
        worker = _worker(model_dir, world, layout)
        entropy = worker.compute_log_prob(batch, calculate_entropy=True)["entropy"]
        engaged = worker.engine.report()  # after the forward only: its fed inputs
        metrics = worker.update_policy(batch)
        out.append({"entropy": entropy, "metrics": {k: v for k, v in metrics.items() if not k.startswith("perf/")},
                    "engaged": engaged})
    return out


def _step(per_rank: list[dict]) -> dict[str, float]:
    """What the driver makes of the ranks' outputs: the token-mean entropy, the reduced metrics."""
    entropy = torch.cat([r["entropy"] for r in per_rank])
    mask = _batch()["response_mask"].bool()
    metrics = reduce_rank_metrics([r["metrics"] for r in per_rank])
    return {"entropy": float(entropy[mask].double().mean()), "grad_norm": metrics["actor/grad_norm"],
            **{k: metrics[k] for k in LOSS_KEYS}}


def _bounds(want: dict[str, float], n_params: int) -> dict[str, float]:
    """fp32 error model (tests/error_model.py: n terms of magnitude M summed in two orders differ
    by at most n * eps * M). Every layout computes the same math in fp32 on the same samples; only
    the summation order moves (packed vs padded rows, the SP all-to-all and gather, micro-batch
    splits, the dp all-reduce, ZeRO's buckets and partitions)."""
    batch = _batch()
    tokens = int(batch["response_mask"].sum())
    # A per-token value leaves the model's chain of accumulations (norms, projections, attention
    # over SEQ, the vocabulary's log-softmax); the step's value is the mean over its tokens.
    terms = toy_chain(SEQ) + tokens
    # Largest per-token terms: entropy <= log V; the dual-clipped policy loss <= clip_ratio_c |A|
    # (3 |A|); the k3 KL is clamped to 10.
    magnitude = {"entropy": math.log(TOY_VOCAB), "actor/pg_loss": 3.0 * float(batch["advantages"].abs().max()),
                 "actor/kl_loss": 10.0}
    out = {key: fp32_tol(terms, m) for key, m in magnitude.items()}
    # Each gradient element sums the chain and the step's tokens (relative eps * terms); the norm
    # then sums the squares of every parameter element: relative eps * (terms + n_params).
    out["grad_norm"] = fp32_tol(terms + n_params, want["grad_norm"])
    return out


def test_step_one_is_the_same_in_every_layout(pooled, tmp_path):
    from transformers import AutoModelForCausalLM

    model_dir = make_model_dir(tmp_path / "model")
    names = list(LAYOUTS)
    two = pooled(_step_one, 2, timeout_s=300, args=(model_dir, [LAYOUTS[n] for n in names]))
    one = pooled(_step_one, 1, timeout_s=120, args=(model_dir, [ONE_RANK]))
    want = _step([one[0][0]])
    n_params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
    bounds = _bounds(want, n_params)
    assert want["grad_norm"] > 0 and all(math.isfinite(v) for v in want.values()), want
    for i, name in enumerate(names):
        layout = LAYOUTS[name]
        # The row ran the layout it names (read back from the engine, not the config).
        for rank in two:
            engaged = rank[i]["engaged"]
            assert engaged["stage"] == layout["stage"] and engaged["sp"] == layout.get("sp", 1), (name, engaged)
            packed_or_sp = layout.get("rmpad", False) or layout.get("sp", 1) > 1
            assert (engaged["fed"]["masked"] == 0) == packed_or_sp, (name, engaged["fed"])
            if layout.get("rmpad") and layout.get("sp", 1) == 1:  # some row held two samples
                assert engaged["fed"]["rows"] < SAMPLES // 2, (name, engaged["fed"])
        got = _step([rank[i] for rank in two])
        for key, tol in bounds.items():
            assert abs(got[key] - want[key]) <= tol, (name, key, got[key], want[key], tol)
    print("\nstep 1 against one rank (|diff| / bound):")
    for i, name in enumerate(names):
        got = _step([rank[i] for rank in two])
        print(f"  {name:<40} " + ", ".join(f"{k} {abs(got[k] - want[k]) / bounds[k]:.2g}" for k in bounds))

