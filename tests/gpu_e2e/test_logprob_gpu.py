"""On CUDA, the log-probs' compiled chunks (:mod:`repro.workers.logprob`, inductor: ``MODE`` ``auto``'s choice for
half-precision logits on a GPU) compute what the eager chunks compute, at the 0.6B shape's vocabulary, in less time
and no more memory.

Error model: both paths read the same bf16 logits and compute in fp32; they differ in summation order (inductor's
reductions against torch's) and in where the gradient is rounded to bf16 (both once, at the end). Neither is exact,
so both are held against fp64 on the same logits: the compiled path's distance from fp64 (log-probs, entropy and
the logits' gradient, as relative L2 norms) is at most twice the eager path's plus one fp32 unit (a reduction order
at most doubles an fp32 sum's rounding), and dynamo captured graphs (a compile that did nothing would pass the
first check trivially). The CPU suite proves the same formulas traced with backend ``aot_eager``
(``tests/unit/workers/test_logprob.py``). Run with ``REPRO_GPU_TESTS=1``.
"""

from __future__ import annotations

import pytest
import torch

from conftest import require_cuda_gpus

pytestmark = pytest.mark.gpu

VOCAB = 151_936  # Qwen3's: the size that makes the log-probs cost more than the LM head


@pytest.fixture(autouse=True)
def _cuda():
    require_cuda_gpus(1)


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref).norm() / ref.norm())


def _run(leaf_data: torch.Tensor, labels: torch.Tensor, w_lp: torch.Tensor, w_ent: torch.Tensor, temperature: float):
    from repro.workers.logprob import token_log_probs

    leaf = leaf_data.clone().requires_grad_(True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    lp, ent = token_log_probs(leaf, labels, temperature=temperature, with_entropy=True)
    ((lp.double() * w_lp).sum() + (ent.double() * w_ent).sum()).backward()
    torch.cuda.synchronize()
    return lp.detach(), ent.detach(), leaf.grad.detach(), torch.cuda.max_memory_allocated() - base


def test_compiled_log_prob_chunks_are_as_close_to_fp64_as_the_eager_chunks(monkeypatch):
    from torch._dynamo.utils import counters

    from repro.workers import logprob

    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    tokens, temperature = 2048, 0.9
    logits = (torch.randn(1, tokens, VOCAB, generator=gen) * 3).to(torch.bfloat16).cuda()
    labels = torch.randint(0, VOCAB, (1, tokens), generator=gen).cuda()
    w_lp = torch.randn(1, tokens, generator=gen, dtype=torch.float64).cuda()
    w_ent = torch.randn(1, tokens, generator=gen, dtype=torch.float64).cuda() * 0.1

    monkeypatch.setattr(logprob, "MODE", "eager")
    eager = _run(logits, labels, w_lp, w_ent, temperature)
    monkeypatch.setattr(logprob, "MODE", "auto")  # bf16 on CUDA: auto is the compiled path
    assert logprob.compiled_for(logits)
    compiled = _run(logits, labels, w_lp, w_ent, temperature)
    assert counters["stats"]["unique_graphs"] >= 2

    # fp64 on the same bf16 logits (one chunk of 256 positions at a time: the full fp64 tensor would be 2.5 GB)
    ref_lp, ref_ent, ref_grad = [], [], []
    for start in range(0, tokens, 256):
        x = logits[:, start:start + 256].double().requires_grad_(True)
        logp = torch.log_softmax(x / temperature, -1)
        lp = logp.gather(-1, labels[:, start:start + 256].unsqueeze(-1)).squeeze(-1)
        ent = -(logp.exp() * logp).sum(-1)
        ((lp * w_lp[:, start:start + 256]).sum() + (ent * w_ent[:, start:start + 256]).sum()).backward()
        ref_lp.append(lp.detach()), ref_ent.append(ent.detach()), ref_grad.append(x.grad)
    ref = (torch.cat(ref_lp, 1), torch.cat(ref_ent, 1), torch.cat(ref_grad, 1))
    fp32_unit = torch.finfo(torch.float32).eps
    for name, got, want, exact in zip(("log-probs", "entropy", "gradient"), compiled[:3], eager[:3], ref, strict=True):
        assert _rel(got, exact) <= 2 * _rel(want, exact) + fp32_unit, (name, _rel(got, exact), _rel(want, exact))
    # memory: beyond the gradient both make, the compiled path holds one chunk's gradient (half precision) before
    # its copy into the gradient; an eager chunk holds two or three fp32 chunks, so the compiled path may not exceed
    # eager's peak by more than that one copy
    chunk_copy = 2 * logprob.COMPILED_CHUNK_ELEMENTS
    assert compiled[3] <= eager[3] + chunk_copy, (compiled[3], eager[3])
