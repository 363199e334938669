"""ZeRO-1/2/3 on 2 gloo ranks train a tiny Qwen3 like single-process PyTorch AdamW, within fp32 rounding.

AdamW's eps is lr: with the usual 1e-8 a gradient that is zero but for summation order (+-1e-12)
becomes a whole lr step on one side, and the weights would compare the CPUs' rounding. With
eps = lr a gradient difference dg moves a weight by at most ADAM_GAIN * dg per step (helpers).
"""

from __future__ import annotations

import time

import pytest
import torch
from transformers import Qwen3ForCausalLM

from repro.data.tiny_model import TOY_VOCAB, toy_qwen3_config
from tests.distributed.workers.helpers import ADAM_GAIN, FP32_EPS, fp32_tol, toy_chain

SEED = 1234
GLOBAL_BATCH = 4
SEQ_LEN = 8
STEPS = 3
WORLD_SIZE = 2
ADAMW = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-3, "weight_decay": 0.01}
# A loss or gradient element sums the toy model's chain and the batch's tokens.
TERMS = toy_chain(SEQ_LEN) + GLOBAL_BATCH * SEQ_LEN


def _build_model() -> Qwen3ForCausalLM:
    torch.manual_seed(SEED)
    # Untied embeddings and no pad token: every parameter is its own ZeRO partition entry.
    return Qwen3ForCausalLM(toy_qwen3_config(tie_word_embeddings=False, pad_token_id=None)).float()


def _global_batches() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(SEED + 1)
    return [
        torch.randint(0, TOY_VOCAB, (GLOBAL_BATCH, SEQ_LEN), generator=gen)
        for _ in range(STEPS)
    ]


def _mean_token_loss(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    # Equal-length rows and no padding: the mean of the per-rank means is the full-batch mean.
    return model(input_ids=input_ids, labels=input_ids).loss


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _reference_trajectory() -> dict[str, list]:
    model = _build_model()
    optimizer = torch.optim.AdamW(model.parameters(), **ADAMW)
    out: dict[str, list] = {"losses": [], "grad_norms": [], "grad_max": [], "snapshots": []}
    for batch in _global_batches():
        optimizer.zero_grad()
        loss = _mean_token_loss(model, batch)
        loss.backward()
        grad_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
        out["grad_max"].append(max(p.grad.abs().max().item() for p in model.parameters()))
        optimizer.step()
        out["losses"].append(loss.item())
        out["grad_norms"].append(grad_norm.item())
        out["snapshots"].append(_snapshot(model))
    return out


def _deepspeed_trajectory(rank: int, world_size: int, stage: int) -> dict[str, list]:
    import deepspeed

    per_rank = GLOBAL_BATCH // world_size
    config = {
        "train_batch_size": GLOBAL_BATCH,
        "train_micro_batch_size_per_gpu": per_rank,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "optimizer": {
            "type": "AdamW",
            "params": {**ADAMW, "betas": list(ADAMW["betas"]), "torch_adam": True},
        },
        "zero_optimization": {"stage": stage},
        "steps_per_print": 10**9,
    }
    model = _build_model()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    out: dict[str, list] = {"losses": [], "grad_norms": [], "snapshots": []}
    for batch in _global_batches():
        loss = _mean_token_loss(engine, batch[rank * per_rank : (rank + 1) * per_rank])
        engine.backward(loss)
        engine.step()
        out["losses"].append(loss.item())
        # Adam hides a wrong gradient scale (sum instead of mean over ranks); the norm does not.
        out["grad_norms"].append(float(engine.get_global_grad_norm()))
        # ZeRO-3 keeps only a shard per rank; gathering is a no-op context for stages 1 and 2.
        params = list(engine.module.parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None, enabled=stage == 3):
            out["snapshots"].append(_snapshot(engine.module))
    return out


@pytest.fixture(scope="module")
def reference() -> dict[str, list]:
    return _reference_trajectory()


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stage_matches_single_process_adamw_for_three_steps(pooled, reference, stage):
    start = time.monotonic()
    results = pooled(_deepspeed_trajectory, world_size=WORLD_SIZE, timeout_s=120, args=(stage,))
    print(f"ZeRO-{stage}: 2 ranks x {STEPS} steps took {time.monotonic() - start:.1f} s")

    initial = _snapshot(_build_model())
    n_params = sum(p.numel() for p in initial.values())
    moved = max((reference["snapshots"][-1][n] - p).abs().max().item() for n, p in initial.items())
    # Per step, each weight within Adam's gain times its gradient's bound, plus the update's rounding.
    p_tols = [ADAM_GAIN * ADAMW["lr"] / ADAMW["eps"] * fp32_tol(TERMS, g_max) + FP32_EPS
              for g_max in reference["grad_max"]]
    assert moved > 10 * sum(p_tols), "reference barely trained; the parity check would be vacuous"
    assert results[0]["losses"] != results[1]["losses"], "ranks saw the same data, not their own halves"

    for step in range(STEPS):
        rank_mean_loss = sum(r["losses"][step] for r in results) / WORLD_SIZE
        want_loss = reference["losses"][step]
        assert rank_mean_loss == pytest.approx(want_loss, abs=fp32_tol(TERMS, want_loss)), f"step {step} loss"
        p_tol = sum(p_tols[: step + 1])
        for rank, r in enumerate(results):
            # the norm also sums the squares of every gradient element
            want_norm = reference["grad_norms"][step]
            assert r["grad_norms"][step] == pytest.approx(want_norm, abs=fp32_tol(TERMS + n_params, want_norm)), (
                f"ZeRO-{stage} rank {rank} step {step} grad norm"
            )
            snapshot, ref_snapshot = r["snapshots"][step], reference["snapshots"][step]
            assert snapshot.keys() == ref_snapshot.keys()
            diffs = {n: (snapshot[n] - ref).abs().max().item() for n, ref in ref_snapshot.items()}
            worst = max(diffs, key=diffs.get)
            print(f"ZeRO-{stage} step {step} rank {rank}: max |param - ref| = {diffs[worst]:.2e} ({worst}), tolerance {p_tol:.2e}")
            assert diffs[worst] <= p_tol, (
                f"ZeRO-{stage} rank {rank} step {step}: {worst} off by {diffs[worst]:.2e} > {p_tol:.2e}"
            )
