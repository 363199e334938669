"""repro's FA4 glue behind aten's two flash ops, run on CPU: the glue registered under the CPU dispatch key with
stand-in kernels that compute what FlashAttention-4 4.0.0b36 computes for its arguments (its
``_resolve_causal_local_window`` and its mask's edges, read in its source), in float64. aten's own autograd formula
for ``_flash_attention_forward`` carries the backward, so a wrong translation of causality or of a layout shows as
attention or gradients off an independent block-causal reference. The kernels themselves run on Hopper/Blackwell
only: ``tests/gpu_e2e/test_varlen_gpu.py`` holds them to the same reference there."""

from __future__ import annotations

import contextlib
import inspect

import pytest
import torch

from repro.workers import fa4_kernels
from repro.workers.fa4_kernels import Glue, fa4_window


def _fa4_band(causal: bool, left: int | None, right: int | None) -> tuple[int | None, int | None]:
    """FA4's reading of its arguments: both edges negative is no window; causal sets the right edge to 0; any other
    edge is taken as it is (so a left edge of -1 lies one past the diagonal)."""
    if left is not None and right is not None and left < 0 and right < 0:
        left = right = None
    return left, 0 if causal else right


def _samples(cu: torch.Tensor) -> list[slice]:
    return [slice(int(a), int(b)) for a, b in zip(cu[:-1], cu[1:], strict=True)]


def _probabilities(q, k, scale, causal, left, right):
    """One sample's softmax over FA4's band: ``[H, n, n]`` (q ``[n, H, D]``, k ``[n, Hk, D]``)."""
    left, right = _fa4_band(causal, left, right)
    n, heads = q.shape[0], q.shape[1]
    k = k.repeat_interleave(heads // k.shape[1], 1)
    rows, cols = torch.arange(n)[:, None], torch.arange(n)[None]
    allowed = torch.ones(n, n, dtype=torch.bool)
    if right is not None:
        allowed &= cols <= rows + right
    if left is not None:
        allowed &= cols >= rows - left
    scores = (torch.einsum("qhd,khd->hqk", q, k) * scale).masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1), scores.logsumexp(-1)


def _as_varlen(*tensors, cu=None):
    """Dense ``[B, L, H, D]`` tensors flattened to the varlen form, with their boundaries."""
    if cu is not None:
        return tensors, cu
    b, length = tensors[0].shape[:2]
    return tuple(t.flatten(0, 1) for t in tensors), torch.arange(0, b * length + 1, length)


def stand_in_fwd(q, k, v, *, cu_seqlens_q=None, softmax_scale=None, causal=False, window_size_left=None,
                 window_size_right=None, return_lse=False, **_):
    dense_shape = q.shape
    (q, k, v), cu = _as_varlen(q, k, v, cu=cu_seqlens_q)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    out, lse = torch.empty_like(q), q.new_empty(q.shape[1], q.shape[0])
    for s in _samples(cu):
        p, lse[:, s] = _probabilities(q[s], k[s], scale, causal, window_size_left, window_size_right)
        out[s] = torch.einsum("hqk,khd->qhd", p, v[s].repeat_interleave(q.shape[1] // v.shape[1], 1))
    if cu_seqlens_q is None:
        out, lse = out.view(dense_shape), lse.view(q.shape[1], dense_shape[0], -1).transpose(0, 1)
    return out, lse, None, None, None  # 4.0.0b36's five results: the glue keeps the leading two


def stand_in_bwd(q, k, v, out, dout, lse, *, softmax_scale=None, causal=False, window_size_left=None,
                 window_size_right=None, cu_seqlens_q=None, **_):
    """FlashAttention's backward in closed form: dV = P^T dO, dS = P (dO V^T - rowsum(dO * O)), dQ = s dS K,
    dK = s dS^T Q, the query heads of a KV head summed."""
    dense_shape = q.shape
    (q, k, v, out, dout), cu = _as_varlen(q, k, v, out, dout, cu=cu_seqlens_q)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    group = q.shape[1] // k.shape[1]
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for s in _samples(cu):
        p, _ = _probabilities(q[s], k[s], scale, causal, window_size_left, window_size_right)
        v_s, k_s = v[s].repeat_interleave(group, 1), k[s].repeat_interleave(group, 1)
        dv_h = torch.einsum("hqk,qhd->khd", p, dout[s])
        dp = torch.einsum("qhd,khd->hqk", dout[s], v_s)
        ds = p * (dp - (dout[s] * out[s]).sum(-1).T[:, :, None])
        dq[s] = torch.einsum("hqk,khd->qhd", ds, k_s) * scale
        dk_h = torch.einsum("hqk,qhd->khd", ds, q[s]) * scale
        dk[s] = dk_h.unflatten(1, (k.shape[1], group)).sum(2)
        dv[s] = dv_h.unflatten(1, (v.shape[1], group)).sum(2)
    if cu_seqlens_q is None:
        dq, dk, dv = (t.view(*dense_shape[:2], *t.shape[1:]) for t in (dq, dk, dv))
    return dq, dk, dv


@pytest.fixture
def glue_on_cpu():
    handle = Glue(stand_in_fwd, stand_in_bwd).register("CPU")
    yield
    handle.remove()


def _packed(lengths, heads=4, kv_heads=2, dim=8):
    gen = torch.Generator().manual_seed(7)
    t = sum(lengths)
    q, k, v = (torch.randn(t, h, dim, generator=gen, dtype=torch.float64).requires_grad_()
               for h in (heads, kv_heads, kv_heads))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, cu, torch.randn(t, heads, dim, generator=gen, dtype=torch.float64)


def _reference(q, k, v, lengths, grad_out, causal, scale=None):
    """Attention within each sample (causal or not) by SDPA with an explicit mask, and its gradients by autograd."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    block = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    mask = block[:, None] == block[None, :]
    if causal:
        mask &= torch.ones_like(mask).tril()
    rep = q.shape[1] // k.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.repeat_interleave(rep, 1).transpose(0, 1), v.repeat_interleave(rep, 1).transpose(0, 1),
        attn_mask=mask, scale=scale).transpose(0, 1)
    out.backward(grad_out)
    return out.detach(), q.grad, k.grad, v.grad


# float64 on both sides, different summation orders over at most ~40 terms: errors ~1e-15; 1e-10 is far below any
# translation error (a wrong mask moves outputs by O(1))
TOL = {"rtol": 0, "atol": 1e-10}


@pytest.mark.parametrize(("is_causal", "left", "right", "causal"), [
    (True, -1, 0, True),      # torch 2.13's varlen_attn: the flag and FA2's causal window together
    (False, -1, 0, True),     # the causal window alone
    (True, None, None, True),  # the flag alone (torch 2.10's varlen_attn)
    (False, -1, -1, False),   # no window: attention within each sample, both ways
], ids=["flag and window", "window", "flag", "no window"])
def test_packed_attention_and_its_gradients_through_the_glue_match_attention_within_each_sample(
        glue_on_cpu, is_causal, left, right, causal):
    lengths = [7, 1, 12, 3, 9]
    q, k, v, cu, grad_out = _packed(lengths)
    out, *_ = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max(lengths), max(lengths), 0.0, is_causal,
                                                      False, scale=0.3, window_size_left=left,
                                                      window_size_right=right)
    out.backward(grad_out)
    ref = _reference(q, k, v, lengths, grad_out, causal, scale=0.3)
    for got, want in zip([out, q.grad, k.grad, v.grad], ref, strict=True):
        torch.testing.assert_close(got, want, **TOL)


def test_without_the_glue_fa4_would_read_fa2s_causal_window_as_a_band_with_no_key_in_it():
    # why fa4_window exists: FA4's reading of aten's causal window as it comes (left edge -1) leaves every row empty
    q, k, _, _, _ = _packed([5])
    _, lse = _probabilities(q.detach(), k.detach(), 1.0, True, -1, 0)
    assert torch.isneginf(lse).all()
    _, lse = _probabilities(q.detach(), k.detach(), 1.0, *fa4_window(True, -1, 0))
    assert torch.isfinite(lse).all()


def test_dense_attention_through_the_glue_matches_causal_sdpa(glue_on_cpu):
    # the dense form, [batch, seq, heads, dim] as SDPA's flash path hands it down, no boundaries in either direction
    q, k, v, _, grad_out = _packed([6, 6])
    dense = [x.detach().view(2, 6, *x.shape[1:]).requires_grad_() for x in (q, k, v)]
    out, *_ = torch.ops.aten._flash_attention_forward(*dense, None, None, 6, 6, 0.0, True, False)
    out.backward(grad_out.view(2, 6, *grad_out.shape[1:]))
    ref = _reference(q, k, v, [6, 6], grad_out, causal=True)
    for got, want in zip([out, *(x.grad for x in dense)], ref, strict=True):
        torch.testing.assert_close(got.flatten(0, 1), want, **TOL)


def test_the_backward_is_deterministic_where_torch_is_asked_for_deterministic_algorithms():
    seen = []

    def recording_bwd(*args, **kwargs):
        seen.append(kwargs["deterministic"])
        return stand_in_bwd(*args, **kwargs)

    handle = Glue(stand_in_fwd, recording_bwd).register("CPU")
    try:
        for deterministic in (False, True):
            q, k, v, cu, grad_out = _packed([3, 4])
            with _deterministic_algorithms(deterministic):
                out, *_ = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, 4, 4, 0.0, True, False)
                out.backward(grad_out)
    finally:
        handle.remove()
    assert seen == [False, True]  # as aten's FA2 backward reads it


@contextlib.contextmanager
def _deterministic_algorithms(on: bool):
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize(("op", "method"), [("_flash_attention_forward", Glue.forward),
                                          ("_flash_attention_backward", Glue.backward)])
def test_the_glue_takes_every_argument_of_this_torchs_schema_by_the_same_name(op, method):
    # the dispatcher passes positional arguments by position and keyword-only ones by name: a torch release adding a
    # keyword to the op would make the registered kernel fail at its first call
    schema = getattr(torch.ops.aten, op).default._schema
    params = list(inspect.signature(method).parameters.values())[1:]  # after self
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    keyword = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
    assert [a.name for a in schema.arguments if not a.kwarg_only] == positional
    assert {a.name for a in schema.arguments if a.kwarg_only} <= keyword


def test_what_fa4_cannot_run_is_refused_by_name(glue_on_cpu):
    q, k, v, cu, _ = _packed([4])
    with pytest.raises(RuntimeError, match=r"model\.flash_attention=fa4: FlashAttention-4 does not run dropout"):
        torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, 4, 4, 0.1, True, False)


@pytest.mark.parametrize(("given", "fa4"), [
    ((True, -1, 0), (True, None, None)), ((False, -1, 0), (True, None, None)),
    ((True, None, None), (True, None, None)), ((False, -1, -1), (False, None, None)),
    ((False, None, None), (False, None, None)), ((True, 128, -1), (False, 128, 0)), ((False, 128, 0), (False, 128, 0)),
    ((False, -1, 4), (False, None, 4)), ((False, 16, 16), (False, 16, 16)),
])
def test_fa2s_window_reads_as_fa4s_causal_flag_or_band(given, fa4):
    assert fa4_window(*given) == fa4


def test_the_registry_reads_the_glue_back_and_restoring_it_leaves_atens_own_kernels():
    registry = pytest.importorskip("torch.nn.attention")
    if not hasattr(registry, "register_flash_attention_impl"):
        pytest.skip(f"torch {torch.__version__} has no flash attention registry")
    name = fa4_kernels.NAME + "_cpu_test"
    registry.register_flash_attention_impl(name, register_fn=lambda: Glue(stand_in_fwd, stand_in_bwd).register("CPU"))
    q, k, v, cu, _ = _packed([3, 2])
    try:
        registry.activate_flash_attention_impl(name)
        assert registry.current_flash_attention_impl() == name
        torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, 3, 3, 0.0, True, False)
    finally:
        registry.restore_flash_attention_impl()
    assert registry.current_flash_attention_impl() is None
    with pytest.raises(NotImplementedError, match="CPU"):  # aten has no CPU kernel of its own for the op
        torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, 3, 3, 0.0, True, False)
