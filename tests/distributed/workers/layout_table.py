"""The layout table of issue 36 item 3: step 1 of the actor in every layout, against one rank.

Shared by the CPU test (``tests/distributed/workers/test_layout_parity.py``: 2 gloo ranks of the warm
pool) and the GPU test (``tests/gpu_e2e/test_layout_parity_gpu.py``: 2 GPUs over NCCL); both run these
rank functions in fp32, so one error model (:func:`bounds`) serves both. What each row compares and why:
the CPU test's module docstring.
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
# The seed's 4-GPU layout (issue 38), dp=2 x sp=2 on 4 ranks: SP groups {0, 1} and {2, 3}.
LAYOUTS_DP2_SP2 = {
    "zero2 dp2 x sp2": {"stage": 2, "sp": 2},
    "zero3 dp2 x sp2 remove-padding token budget": {"stage": 3, "sp": 2, "rmpad": True, "budget": 14},
}
ONE_RANK = {"stage": 1}
LOSS_KEYS = ("actor/pg_loss", "actor/kl_loss")


def step_batch() -> dict[str, torch.Tensor]:
    return make_step_batch(SEED, SAMPLES, empty_rows=EMPTY)


def make_worker(model_dir: str, world: int, layout: dict):
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


def step_one(rank: int, world: int, model_dir: str, layouts: list[dict]) -> list[dict]:
    """Per layout, on this rank: step 1's per-token entropy of its rows, its update metrics, the read-back."""
    out = []
    batch = shard(step_batch(), rank, world)
    for layout in layouts:
        worker = make_worker(model_dir, world, layout)
        entropy = worker.compute_log_prob(batch, calculate_entropy=True)["entropy"]
        engaged = worker.engine.report()  # after the forward only: its fed inputs
        metrics = worker.update_policy(batch)
        out.append({"entropy": entropy, "metrics": {k: v for k, v in metrics.items() if not k.startswith("perf/")},
                    "engaged": engaged})
    return out


def step(per_rank: list[dict]) -> dict[str, float]:
    """What the driver makes of the ranks' outputs: the token-mean entropy, the reduced metrics."""
    entropy = torch.cat([r["entropy"] for r in per_rank])
    mask = step_batch()["response_mask"].bool()
    metrics = reduce_rank_metrics([r["metrics"] for r in per_rank])
    return {"entropy": float(entropy[mask].double().mean()), "grad_norm": metrics["actor/grad_norm"],
            **{k: metrics[k] for k in LOSS_KEYS}}


def bounds(want: dict[str, float], n_params: int) -> dict[str, float]:
    """fp32 error model (tests/error_model.py: n terms of magnitude M summed in two orders differ
    by at most n * eps * M). Every layout computes the same math in fp32 on the same samples; only
    the summation order moves (packed vs padded rows, the SP all-to-all and gather, micro-batch
    splits, the dp all-reduce, ZeRO's buckets and partitions)."""
    batch = step_batch()
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


def check(two: list[list[dict]], one: list[list[dict]], model_dir: str, layouts: dict | None = None) -> list[str]:
    """Assert every layout of ``layouts`` (default :data:`LAYOUTS`), run as ``two`` (per rank, per layout),
    against ``one`` (one rank, :data:`ONE_RANK`); return the report lines (|diff| / bound per value)."""
    from transformers import AutoModelForCausalLM

    layouts = LAYOUTS if layouts is None else layouts
    names = list(layouts)
    want = step([one[0][0]])
    n_params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
    tol = bounds(want, n_params)
    assert want["grad_norm"] > 0 and all(math.isfinite(v) for v in want.values()), want
    lines = []
    for i, name in enumerate(names):
        layout = layouts[name]
        # The row ran the layout it names (read back from the engine, not the config).
        for rank in two:
            engaged = rank[i]["engaged"]
            assert engaged["stage"] == layout["stage"] and engaged["sp"] == layout.get("sp", 1), (name, engaged)
            packed_or_sp = layout.get("rmpad", False) or layout.get("sp", 1) > 1
            assert (engaged["fed"]["masked"] == 0) == packed_or_sp, (name, engaged["fed"])
            if layout.get("rmpad") and layout.get("sp", 1) == 1:  # some row held two samples
                assert engaged["fed"]["rows"] < SAMPLES // 2, (name, engaged["fed"])
        got = step([rank[i] for rank in two])
        for key, t in tol.items():
            assert abs(got[key] - want[key]) <= t, (name, key, got[key], want[key], t)
        lines.append(f"  {name:<40} " + ", ".join(f"{k} {abs(got[k] - want[k]) / tol[k]:.2g}" for k in tol))
    return lines
