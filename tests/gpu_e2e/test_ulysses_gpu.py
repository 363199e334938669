"""On 2 GPUs over NCCL, Ulysses sp=2 in bf16 attends with FlashAttention over the gathered sequence's
samples (:mod:`repro.workers.varlen` as the core attention of :mod:`repro.workers.ulysses`) and gives
the one-GPU padded forward's response log-probs within bf16 tolerance, as the block-causal SDPA core does.

Error model: the same bf16 weights and inputs; the kernels (FlashAttention against SDPA's
memory-efficient kernel with a mask) round differently, each op's result to 2^-8 relative. Log-probs of
a 512-token vocabulary are ~6 in magnitude, so one bf16 unit there is ~0.025; the bound is 0.05 (two
units), as the one-GPU varlen test's. Attending across the samples (one block per row) misses it by far,
so the bound can fail. Run with ``REPRO_GPU_TESTS=1`` (the repository conftest otherwise pins DeepSpeed
to the CPU).
"""

from __future__ import annotations

import copy

import pytest

from conftest import require_cuda_gpus
from tests.multirank import run_ranks

pytestmark = pytest.mark.gpu

B, P, R, VOCAB, BOUND = 4, 40, 56, 512, 0.05


def _model_and_batch():
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
                      initializer_range=0.2, attn_implementation="sdpa")
    model = Qwen3ForCausalLM(cfg).to("cuda", torch.bfloat16)
    gen = torch.Generator().manual_seed(1)
    prompt_mask = torch.arange(P)[None] >= (P - torch.randint(4, P + 1, (B,), generator=gen))[:, None]
    response_mask = torch.arange(R)[None] < torch.randint(1, R + 1, (B,), generator=gen)[:, None]
    mask = torch.cat([prompt_mask, response_mask], 1).long()
    ids = torch.randint(3, VOCAB, (B, P + R), generator=gen) * mask
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    return model, ids.cuda(), mask.cuda(), pos.cuda(), response_mask.cuda()


def _sp_against_one_gpu(rank: int, world: int) -> dict:
    import torch

    from repro.workers import ulysses, varlen
    from repro.workers.logprob import token_log_probs

    model, ids, mask, pos, response_mask = _model_and_batch()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
        padded = token_log_probs(logits[:, P - 1:-1], ids[:, P:])[0]
    sp_model = copy.deepcopy(model)
    ulysses.enable(sp_model, world, "actor")

    def response_log_probs(positions):
        varlen._cache = None
        out = ulysses.token_forward(sp_model, ids, positions, world,
                                    lambda o, labels: (token_log_probs(o.logits, labels)[0],))[0]
        return out[:, P - 1:-1]

    def max_diff(lp):
        return ((lp - padded).abs() * response_mask).max().item()

    with torch.no_grad():
        flash = response_log_probs(pos)
        used_varlen = varlen._cache is not None  # the varlen path computed this forward's samples
        across = max_diff(response_log_probs(torch.arange(P + R, device=pos.device).expand(B, -1)))
        varlen.ENABLED = False
        sdpa = max_diff(response_log_probs(pos))
    return {"flash": max_diff(flash), "sdpa": sdpa, "across": across, "used_varlen": used_varlen,
            "backend": torch.distributed.get_backend()}


def test_ulysses_sp2_flash_core_matches_the_one_gpu_padded_forward_in_bf16(tmp_path):
    require_cuda_gpus(2)
    results = run_ranks(_sp_against_one_gpu, 2, tmp_path=tmp_path, timeout_s=180, backend="nccl",
                        env={"PYTHONUNBUFFERED": "1"})
    for r in results:
        print(f"max |log-prob diff| vs one GPU: flash core {r['flash']:.4g}, block-causal SDPA core "
              f"{r['sdpa']:.4g}, one block per row {r['across']:.4g}")
        assert r["backend"] == "nccl" and r["used_varlen"], r
        assert r["flash"] < BOUND and r["sdpa"] < BOUND, r
        assert r["across"] > 10 * BOUND, r
