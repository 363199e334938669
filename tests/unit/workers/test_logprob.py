"""Chunked log-probs and entropy equal the full-vocabulary computation, and their temporaries
are bounded by the chunk size instead of growing with the vocabulary."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from repro.rl.algorithms import entropy_from_logits, logprobs_from_logits
from repro.workers import logprob
from repro.workers.logprob import token_log_probs
from tests.error_model import float_tol


def _tols(dtype: torch.dtype, x: torch.Tensor, w_lp: torch.Tensor, w_ent: torch.Tensor,
          temperature: float) -> tuple[float, float]:
    """(values, gradients) bounds of two summation orders (tests/error_model.py) for the logits ``x``.

    A token's log-sum-exp and entropy each sum its V terms (plus the shift, exp, gather and
    subtraction: V + 4), of magnitude M = max |x / T| + log V. The gradient w_lp (onehot - p) / T +
    w_ent p (E_p[x] - x) / T inherits p's relative error (that of the log-sum-exp) scaled by
    |w_lp| + 2 M |w_ent| over T.
    """
    v = x.shape[-1]
    m = float(x.detach().abs().max()) / temperature + math.log(v)
    values = float_tol(v + 4, m, dtype)
    scale = (float(w_lp.abs().max()) + 2 * m * float(w_ent.abs().max())) / temperature
    return values, values * scale


def _full(logits, labels, temperature):
    x = logits / temperature
    if x.dtype == torch.float64:  # repro.rl.algorithms computes in fp32; the proof here needs fp64
        log_probs = torch.log_softmax(x, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        return log_probs, entropy_from_logits(x)
    return logprobs_from_logits(x, labels), entropy_from_logits(x.float())


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 3), t=st.integers(1, 7), v=st.integers(2, 40), chunk=st.integers(1, 200),
    temperature=st.sampled_from([1.0, 0.7, 1.3]), seed=st.integers(0, 2**16), with_entropy=st.booleans(),
    dtype=st.sampled_from([torch.float64, torch.float32]),
)
def test_chunked_log_probs_entropy_and_gradients_equal_full_computation(b, t, v, chunk, temperature, seed,
                                                                         with_entropy, dtype):
    gen = torch.Generator().manual_seed(seed)
    # fp64 proves the algebra (any logit scale); fp32 the dtype the workers use, where both
    # sides round at ~1e-7 relative
    scale = 3.0 if dtype == torch.float64 else 1.0
    base = scale * torch.randn(b, t + 1, v, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, v, (b, t), generator=gen)
    w_lp, w_ent = torch.randn(b, t, generator=gen, dtype=torch.float64), torch.randn(b, t, generator=gen,
                                                                                      dtype=torch.float64)
    grads, outs = [], []
    for chunked in (True, False):
        leaf = base.to(dtype).requires_grad_(True)
        logits = leaf[:, :-1]  # a strided slice, as the workers pass it
        if chunked:
            lp, ent = token_log_probs(logits, labels, temperature=temperature, with_entropy=with_entropy,
                                      chunk_elements=chunk)
        else:
            lp, ent = _full(logits, labels, temperature)
            ent = ent if with_entropy else None
        loss = (lp * w_lp).sum() + ((ent * w_ent).sum() if with_entropy else 0)
        loss.backward()
        grads.append(leaf.grad)
        outs.append((lp, ent))
    # The chunks split tokens, never a token's vocabulary: the same math as the full computation,
    # summed in another order (and in fp64 the proof of the algebra, at fp64's own bound).
    tol, grad_tol = _tols(dtype, base, w_lp, w_ent if with_entropy else torch.zeros(1), temperature)
    assert (outs[0][0].double() - outs[1][0].double()).abs().max() <= tol
    if with_entropy:
        assert (outs[0][1].double() - outs[1][1].double()).abs().max() <= tol
    else:
        assert outs[0][1] is None
    assert (grads[0] - grads[1]).abs().max() <= grad_tol


class _LargestAllocation(TorchDispatchMode):
    """Bytes of the largest tensor any op creates, skipping those shaped and typed like ``exclude``
    (the logits' gradient, which every backward of the logits allocates)."""

    def __init__(self, exclude: torch.Tensor) -> None:
        super().__init__()
        self.exclude, self.largest = (exclude.shape, exclude.dtype), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        # Views, in-place ops and detach return an input's storage: only fresh storage counts.
        inputs = {a.untyped_storage().data_ptr() for a in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(a, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if (isinstance(t, torch.Tensor) and (t.shape, t.dtype) != self.exclude
                    and t.untyped_storage().data_ptr() not in inputs):
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


def _largest_temporary(vocab: int, chunked: bool) -> int:
    torch.manual_seed(0)
    logits = torch.randn(4, 64, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (4, 64))
    mode = _LargestAllocation(exclude=logits)
    with mode:
        if chunked:
            lp, ent = token_log_probs(logits, labels, with_entropy=True, chunk_elements=4096)
        else:
            lp, ent = _full(logits, labels, 1.0)
        (lp.sum() + ent.sum()).backward()
    return mode.largest


def test_chunked_log_prob_temporaries_do_not_grow_with_vocabulary():
    full_small, full_large = _largest_temporary(256, False), _largest_temporary(2048, False)
    chunk_small, chunk_large = _largest_temporary(256, True), _largest_temporary(2048, True)
    # The full computation's fp32 copies are tokens * vocab * 4 bytes: 8x the vocabulary, 8x the bytes.
    assert full_large >= 8 * full_small * 0.99 and full_large >= 4 * 64 * 2048 * 4
    # Chunked: the largest temporary is one fp32 chunk (4096 values), whatever the vocabulary.
    assert chunk_small <= 4096 * 4 and chunk_large <= 4096 * 4, (chunk_small, chunk_large)


class _LogSumExpCalls(TorchDispatchMode):
    """How many log-sum-exp reductions (one per chunk in the forward) the ops issue."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func.overloadpacket == torch.ops.aten.logsumexp
        return func(*args, **(kwargs or {}))


def _forward_chunks(b: int, t: int, v: int, chunk_elements: int) -> int:
    logits, labels = torch.randn(b, t + 1, v)[:, :-1], torch.randint(0, v, (b, t))
    with _LogSumExpCalls() as mode:
        token_log_probs(logits, labels, chunk_elements=chunk_elements)
    return mode.calls


def test_short_sequences_share_a_chunk_instead_of_taking_one_each():
    # An RL micro-batch of short responses over a small vocabulary: 128 x 12 x 500 values fit one
    # chunk; one chunk per sequence was 128 x a dozen launches, most of a launch-bound GPU step.
    assert _forward_chunks(128, 12, 500, 1 << 24) == 1
    assert _forward_chunks(128, 12, 500, 12 * 500 * 40) == 4  # 40 sequences a chunk: 40 + 40 + 40 + 8
    # A sequence longer than a chunk is cut along its positions, as before: 2 rows x ceil(12 / 5).
    assert _forward_chunks(2, 12, 500, 5 * 500) == 6


def test_auto_mode_keeps_cpu_logits_on_the_exact_eager_path_and_a_bad_mode_names_the_choices(monkeypatch) -> None:
    logits = torch.zeros(1, 2, 8, dtype=torch.bfloat16)
    assert logprob.MODE == "auto" and not logprob.compiled_for(logits)  # CPU: the goldens' path
    monkeypatch.setattr(logprob, "MODE", "fast")
    with pytest.raises(ValueError, match=r"MODE='fast' is not valid; choose one of \['auto', 'compiled', 'eager'\]"):
        logprob.compiled_for(logits)


@pytest.mark.parametrize("dtype,temperature,with_entropy", [(torch.bfloat16, 0.7, True), (torch.float32, 1.0, False)])
def test_compiled_chunks_compute_the_eager_chunks_values_and_gradients(monkeypatch, dtype, temperature,
                                                                       with_entropy) -> None:
    """The compiled path's formulas (one-hot by comparison, no scatter; fp32 whatever the logits) traced by dynamo and
    run by torch's kernels (backend ``aot_eager``: inductor's generated kernels are the GPU test's,
    ``tests/gpu_e2e/test_logprob_gpu.py``), against the eager chunks within two summation orders' bound."""
    from torch._dynamo.utils import counters

    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)  # the suites switch dynamo off (conftest.py)
    monkeypatch.setattr(logprob, "BACKEND", "aot_eager")
    monkeypatch.setattr(logprob, "_COMPILED", {})
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(0)
    b, t, v = 2, 9, 300
    base = torch.randn(b, t + 1, v, generator=gen, dtype=torch.float64) * 2
    labels = torch.randint(0, v, (b, t), generator=gen)
    w_lp, w_ent = torch.randn(b, t, generator=gen, dtype=torch.float64), torch.randn(b, t, generator=gen,
                                                                                      dtype=torch.float64)
    outs, grads = [], []
    for mode in ("eager", "compiled"):
        monkeypatch.setattr(logprob, "MODE", mode)
        leaf = base.to(dtype).requires_grad_(True)
        # 4 positions a chunk: chunks of two lengths (4 and 1), as micro-batches give, under one dynamic graph
        lp, ent = token_log_probs(leaf[:, :-1], labels, temperature=temperature, with_entropy=with_entropy,
                                  chunk_elements=4 * v)
        ((lp.double() * w_lp).sum() + ((ent.double() * w_ent).sum() if with_entropy else 0)).backward()
        outs.append((lp, ent))
        grads.append(leaf.grad)
    assert counters["stats"]["unique_graphs"] >= 2  # forward and backward ran compiled, not silently eager
    assert outs[1][0].dtype == torch.float32 and grads[1].dtype == dtype
    tol, grad_tol = _tols(torch.float32, base, w_lp, w_ent if with_entropy else torch.zeros(1), temperature)
    assert (outs[0][0].double() - outs[1][0].double()).abs().max() <= tol
    if with_entropy:
        assert (outs[0][1].double() - outs[1][1].double()).abs().max() <= tol
    # the gradient is rounded to the logits' dtype at the end on both paths: one unit of it more
    unit = torch.finfo(dtype).eps * float(grads[0].double().abs().max())
    assert (grads[0].double() - grads[1].double()).abs().max() <= grad_tol + unit
