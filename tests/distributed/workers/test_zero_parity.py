"""Actor and critic updates on 2 gloo ranks equal a single-process PyTorch reference (fp32).

At ZeRO-3 the decoder layers are leaf modules (the workers' default), and the offload cases
offload: both read back from the engine (``RoleEngine.report``, ``repro.workers.engaged``), not
from the config.
Each test runs one ZeRO stage; inside the same two rank processes it trains the actor and the
critic with and without CPU offload (and with parameter offload at ZeRO-3), so the start-up
cost is paid once per stage. Two RL steps of two mini-batches (two micro-batches each) each.
AdamW runs with eps = lr so that a summation-order difference in a gradient moves the weights by
a bounded amount (``helpers.PARITY_ADAM_EPS_PER_LR``); tolerances come from ``helpers.fp32_tol``.
"""

from __future__ import annotations

import pytest
import torch

from repro.data.tiny_model import toy_qwen3_config
from tests.distributed.workers.helpers import (
    ADAM_GAIN,
    FP32_EPS,
    PARITY_ADAM_EPS_PER_LR,
    ZERO3_PARTITION_ALL,
    Reference,
    fp32_tol,
    global_mini_batches,
    make_cfg,
    make_model_dir,
    make_step_batch,
    max_abs_diff,
    params_of,
    shard,
    toy_chain,
)

STEPS = 2
SAMPLES = 8  # train_batch_size 4 x n 2
SEQ = 12
MINI_TOKENS = 4 * SEQ  # a global mini-batch: 2 samples per rank on 2 ranks
# A loss, or a gradient element, sums the chain of the toy model and the mini-batch's tokens;
# the grad norm then sums the squares of every gradient element (the parameter count).
TERMS = toy_chain(SEQ) + MINI_TOKENS
# The toy model's attention projections hold 512-1,024 elements, its MLP matrices and embedding 2,048.
PERSIST = 1024


def _cases(stage: int) -> list[dict]:
    offloads = [("none", False), ("cpu", False)] + ([("cpu", True)] if stage == 3 else [])
    cases = [
        {"role": role, "stage": stage, "offload": off, "param_offload": po}
        for off, po in offloads
        for role in ("actor", "critic")
    ]
    # ZeRO-3 with torch's linear (memory_efficient_linear=false), after engines that replaced
    # torch.nn.functional.linear in this process, so the case also proves the replacement undone; then
    # with it the layers' small weights whole on every rank (the fastest ZeRO-3 of the worker benchmark,
    # results/actor_update/README.md session 19): persistence PERSIST keeps the attention projections and
    # norms whole and leaves the MLP and the (tied) embedding sharded, so both kinds update in one step.
    torch_linear = {"role": "actor", "stage": 3, "offload": "none", "param_offload": False, "linear": "torch"}
    return cases + ([torch_linear, {**torch_linear, "persistence": PERSIST}] if stage == 3 else [])


def _cfg(model_dir: str, case: dict, world: int):
    cfg = make_cfg(model_dir, world=world, stage=case["stage"], offload=case["offload"],
                   param_offload=case["param_offload"], micro=1, use_kl_loss=True, entropy_coeff=0.01)
    for section in (cfg.actor_rollout_ref.actor, cfg.critic):
        section.optim.eps = PARITY_ADAM_EPS_PER_LR * section.optim.lr
    if case.get("linear") == "torch":
        cfg.actor_rollout_ref.actor.deepspeed.memory_efficient_linear = False
    if "persistence" in case:
        cfg.actor_rollout_ref.actor.deepspeed.stage3_param_persistence_threshold = case["persistence"]
    return cfg


def _train_cases(rank: int, world: int, model_dir: str, cases: list[dict]) -> list[dict]:
    import time

    from repro.workers.actor import ActorWorker
    from repro.workers.critic import CriticWorker

    out = []
    for case in cases:
        t0 = time.perf_counter()
        cfg = _cfg(model_dir, case, world)
        # Every other ZeRO-3 case partitions every parameter, however small (the toy model's are all small).
        overrides = ZERO3_PARTITION_ALL if case["stage"] == 3 and "persistence" not in case else None
        worker = ActorWorker(cfg, ds_overrides=overrides) if case["role"] == "actor" else CriticWorker(
            cfg, ds_overrides=overrides)
        init = params_of(worker)
        metrics = []
        for step in range(STEPS):
            batch = shard(make_step_batch(100 + step, SAMPLES), rank, world)
            update = worker.update_policy if case["role"] == "actor" else worker.update_critic
            metrics.append(update(batch))
        out.append({"init": init, "final": params_of(worker), "metrics": metrics, "engaged": worker.engine.report()})
        print(f"case {case}: {time.perf_counter() - t0:.1f} s", flush=True)
    return out


def _check_against_reference(model_dir: str, cases: list[dict], results: list[list[dict]], world: int) -> None:
    # The parameters a persistence threshold keeps whole, counted on the plain model (DeepSpeed: numel <= it).
    init = results[0][0]["init"]
    persistent = {PERSIST: sum(1 for t in init.values() if t.numel() <= PERSIST)}
    assert 0 < persistent[PERSIST] < len(init), persistent
    for i, case in enumerate(cases):
        cfg = _cfg(model_dir, case, world)
        ranks = [r[i] for r in results]
        # ZeRO-3 runs with the decoder layers as leaf modules (the workers' default): exact all the
        # same. Read back: the layers DeepSpeed registered as leaves at initialize, none of whose
        # submodules got a fetch hook of their own; and where the optimizer states and the
        # parameter partitions really are.
        for rank in ranks:
            engaged = rank["engaged"]
            assert engaged["stage"] == case["stage"], case
            layers = toy_qwen3_config().num_hidden_layers if case["stage"] == 3 else 0
            assert engaged["zero3_leaves"] == ["Qwen3DecoderLayer"] * layers, (case, engaged)
            assert engaged["zero3_hooked_in_leaves"] == 0, (case, engaged)
            placed = ("cpu_offload" if case["offload"] == "cpu" else "device",
                      "cpu_offload" if case["param_offload"] else "device")
            assert (engaged["optimizer"], engaged["param"]) == placed, (case, engaged)
            if case["stage"] == 3:  # below ZeRO-3 the process's earlier engines decide it
                assert engaged["linear"] == case.get("linear", "deepspeed"), (case, engaged)
            assert engaged["zero3_persistent_params"] == persistent.get(case.get("persistence"), 0), (case, engaged)
        # Every rank holds the same full weights after gathering.
        assert max_abs_diff(ranks[0]["final"], ranks[1]["final"]) == 0.0, case
        ref = Reference(cfg, case["role"])
        ref.set_weights(ranks[0]["init"])
        prefix = "actor" if case["role"] == "actor" else "critic"
        loss_key = "actor/pg_loss" if prefix == "actor" else "critic/vf_loss"
        n_params = sum(t.numel() for t in ranks[0]["init"].values())
        p_tol = 0.0
        for step in range(STEPS):
            minis = global_mini_batches(make_step_batch(100 + step, SAMPLES), world, per_rank_mini=2)
            outs = [ref.update(m) for m in minis]
            ds_norm = ranks[0]["metrics"][step][f"{prefix}/grad_norm"]
            want_norm = sum(n for _, n in outs) / len(outs)
            assert ds_norm == pytest.approx(want_norm, abs=fp32_tol(TERMS + n_params, want_norm)), case
            if prefix == "critic":  # the actor's loss also holds KL and entropy terms
                ds_loss = sum(r["metrics"][step][loss_key] for r in ranks) / world
                want = sum(loss for loss, _ in outs) / len(outs)
                assert ds_loss == pytest.approx(want, abs=fp32_tol(TERMS, max(abs(want), 1.0))), case
            assert ranks[0]["metrics"][step][f"{prefix}/skipped_steps"] == 0.0
            # Each update: every gradient element within fp32_tol(TERMS, |g|max <= norm) (clipping
            # scales both sides by clip / norm <= 1), times Adam's bounded gain, plus the update's rounding.
            for _, norm in outs:
                p_tol += ADAM_GAIN / PARITY_ADAM_EPS_PER_LR * fp32_tol(TERMS, norm) + FP32_EPS
        diff = max_abs_diff(ranks[0]["final"], ref.params())
        moved = max_abs_diff(ranks[0]["final"], ranks[0]["init"])
        assert moved > 10 * p_tol, f"{case}: the update did not move the weights ({moved}, tolerance {p_tol:.3g})"
        assert diff <= p_tol, f"{case}: max |DeepSpeed - reference| = {diff:.3g} > {p_tol:.3g}"


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_actor_and_critic_updates_match_single_process_reference(stage, pooled, tmp_path):
    model_dir = make_model_dir(tmp_path / "model")
    cases = _cases(stage)
    results = pooled(_train_cases, 2, timeout_s=120, args=(model_dir, cases))
    torch.manual_seed(0)
    _check_against_reference(model_dir, cases, results, world=2)
