"""LoRA together with Ulysses sequence parallelism (sp=2, dp=1, 2 gloo ranks) at ZeRO-2 and 3:
the adapters' update and the merged weights the rollout receives equal single-process peft
training on the full sequences, and the log-probs afterwards a plain forward of those merged
weights, with padding and packed rows.

The reference is peft's own LoRA on a plain Hugging Face model with torch AdamW; it starts from
the worker's initial adapters (A is drawn from the torch seed; B is zero). Tolerances follow the
fp32 error model (``tests/error_model.py``); AdamW runs with eps = lr, so parameters after a step
differ by at most Adam's bounded gain times the gradients' bound (``helpers.PARITY_ADAM_EPS_PER_LR``).
Both features are read back from the engine (``RoleEngine.report``): adapters on the model and
only they in DeepSpeed's optimizer, a 2-rank sequence-parallel group and Ulysses' attention."""

from __future__ import annotations

import pytest
import torch

from repro.rl.algorithms import logprobs_from_logits
from tests.distributed.workers.helpers import (
    ADAM_GAIN,
    FP32_EPS,
    PARITY_ADAM_EPS_PER_LR,
    Reference,
    fp32_tol,
    make_cfg,
    make_model_dir,
    make_step_batch,
    params_of,
    shard,
    toy_chain,
)

SAMPLES = 8
SEQ = 12  # make_step_batch: prompt 6 + response 6
RANK, ALPHA = 4, 8
# A forward value: the toy model's chain with the adapters' extra sums.
CHAIN = toy_chain(SEQ, lora_rank=RANK)
# A gradient element also sums a mini-batch's tokens (4 samples).
TERMS = CHAIN + 4 * SEQ


def _cfg(model_dir: str, stage: int, remove_padding: bool):
    cfg = make_cfg(model_dir, world=2, stage=stage, micro=2, use_kl_loss=True, entropy_coeff=0.01, grad_clip=100.0,
                   max_tokens=10)
    arr = cfg.actor_rollout_ref
    arr.actor.ulysses_sequence_parallel_size = 2
    arr.model.use_remove_padding = remove_padding
    arr.model.lora_rank, arr.model.lora_alpha = RANK, ALPHA
    arr.rollout.log_prob_micro_batch_size_per_gpu = 3
    # As in test_ulysses: at eps 1e-8 Adam turns fp32 summation-order noise in a gradient element
    # near eps into a share of lr; eps = lr bounds that gain (helpers.PARITY_ADAM_EPS_PER_LR).
    arr.actor.optim.eps = PARITY_ADAM_EPS_PER_LR * arr.actor.optim.lr
    return cfg


def _adapters(worker) -> dict[str, torch.Tensor]:
    from repro.workers import lora

    return {k: v.float() for k, v in lora.adapter_state(worker.engine.module, worker.ds.zero_stage == 3).items()}


def _run(rank: int, world: int, model_dir: str, stage: int) -> list[dict]:
    from repro.workers.actor import ActorWorker

    out = []
    batch = shard(make_step_batch(41, SAMPLES), rank, world)
    probe = shard(make_step_batch(77, SAMPLES), rank, world)
    for remove_padding in (False, True):
        worker = ActorWorker(_cfg(model_dir, stage, remove_padding))
        adapters0 = _adapters(worker)
        metrics = worker.update_policy(batch)
        out.append({"rmpad": remove_padding, "adapters0": adapters0, "engaged": worker.engine.report(), "adapters1": _adapters(worker),
                    "merged": params_of(worker), "grad_norm": metrics["actor/grad_norm"],
                    "log_probs": worker.compute_log_prob(probe)["log_probs"]})
    return out


def _reference(model_dir: str, stage: int, adapters0: dict[str, torch.Tensor]):
    """peft LoRA on the full sequences: the step's two mini-batches, one AdamW update each."""
    from peft import LoraConfig, get_peft_model

    cfg = _cfg(model_dir, stage, False)
    ref = Reference(cfg, "actor")
    ref.model = get_peft_model(ref.model, LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, bias="none",
                                                     target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, param in ref.model.named_parameters():
            if ".lora_" in name:
                param.copy_(adapters0[name])
    o = cfg.actor_rollout_ref.actor.optim
    ref.opt = torch.optim.AdamW([p for p in ref.model.parameters() if p.requires_grad], lr=o.lr,
                                betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
    batch = make_step_batch(41, SAMPLES)
    norms = [ref.update({k: v[s:s + 4] for k, v in batch.items()})[1] for s in (0, 4)]
    adapters = {n: p.detach().clone() for n, p in ref.model.named_parameters() if ".lora_" in n}
    merged = {n: p.detach().clone() for n, p in ref.model.merge_and_unload().named_parameters()}
    return adapters, merged, norms


def _log_probs_of(model_dir: str, merged: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """A plain Hugging Face forward of the given merged weights (the rollout's view of the actor)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.load_state_dict(merged, strict=False)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits[:, -batch["responses"].shape[1] - 1:-1]
    return logprobs_from_logits(logits, batch["responses"])


def _merged_tol(p_tol: float, adapters: dict[str, torch.Tensor], merged: dict[str, torch.Tensor]) -> float:
    """W + s B A with A and B each within ``p_tol``: s * RANK * (|dB| |A| + |B| |dA| + |dA| |dB|),
    plus the merge's own rounding (RANK products and the sum with W)."""
    a = max(t.abs().max().item() for k, t in adapters.items() if ".lora_A." in k)
    b = max(t.abs().max().item() for k, t in adapters.items() if ".lora_B." in k)
    w = max(t.abs().max().item() for t in merged.values())
    return ALPHA / RANK * RANK * p_tol * (a + b + p_tol) + fp32_tol(RANK + 1, w)


@pytest.mark.parametrize("stage", [2, 3])
def test_lora_with_sp2_equals_single_process_peft(pooled, tmp_path, stage):
    model_dir = make_model_dir(tmp_path / "model")
    results = pooled(_run, 2, timeout_s=150, args=(model_dir, stage))
    # dp=1: both SP ranks hold the whole model; they must start from the same adapters.
    for a, b in zip(results[0], results[1], strict=True):
        assert all(torch.equal(a["adapters0"][k], b["adapters0"][k]) for k in a["adapters0"])
    want_adapters, want_merged, want_norms = _reference(model_dir, stage, results[0][0]["adapters0"])
    n_params = sum(t.numel() for t in want_adapters.values())
    # per update: Adam's bounded gain times each gradient element's bound (|g| <= the norm; no
    # clipping at grad_clip 100), plus the update's rounding (eps * |p|, |p| < 1)
    p_tol = sum(ADAM_GAIN / PARITY_ADAM_EPS_PER_LR * fp32_tol(TERMS, n) + FP32_EPS for n in want_norms)
    m_tol = _merged_tol(p_tol, want_adapters, want_merged)
    want_norm = sum(want_norms) / 2
    probe = make_step_batch(77, SAMPLES)
    for rank in range(2):
        rows = slice(rank * 4, rank * 4 + 4)
        mask = probe["response_mask"][rows].bool()
        for res in results[rank]:
            case = (stage, rank, res["rmpad"])
            engaged = res["engaged"]
            assert engaged["lora_layers"] > 0 and engaged["optimizer_params"] == 2 * engaged["lora_layers"], engaged
            assert engaged["optimizer_base_params"] == 0 and engaged["trainable_base_params"] == 0, engaged
            assert engaged["sp"] == 2 and engaged["attention"] == "repro_ulysses_actor", engaged
            # the update's forwards: mask-free rows, each rank at most half of its group's [8, 12]
            assert engaged["fed"]["masked"] == 0 and 2 * engaged["fed"]["tokens"] <= SAMPLES * SEQ, engaged
            assert res["adapters1"].keys() == want_adapters.keys(), case
            moved = max((res["adapters1"][k] - res["adapters0"][k]).abs().max().item() for k in want_adapters)
            assert moved > 10 * p_tol, (case, "the adapters did not train", moved, p_tol)
            diff = max((res["adapters1"][k] - want_adapters[k]).abs().max().item() for k in want_adapters)
            assert diff <= p_tol, (case, "adapters", diff, p_tol)
            diff = max((res["merged"][k] - want_merged[k]).abs().max().item() for k in want_merged)
            assert diff <= m_tol, (case, "merged weights", diff, m_tol)
            # The engine's SP forward with its adapters against a plain forward of its own merged
            # weights: the same weights, two summation orders.
            want = _log_probs_of(model_dir, res["merged"], probe)[rows][mask]
            diff = (res["log_probs"][mask] - want).abs().max().item()
            tol = fp32_tol(CHAIN, want.abs().max())
            assert diff <= tol, (case, "log-probs after the update", diff, tol)
            # the norm also sums the squares of every adapter gradient element
            assert abs(res["grad_norm"] - want_norm) <= fp32_tol(TERMS + n_params, want_norm), case
