"""FlashAttention-4 behind aten's two flash ops: repro's glue (``model.flash_attention=fa4``).

torch's own FA4 glue (``torch.nn.attention._fa4``) did not carry repro's packed attention on one H200 with torch 2.11
(session 25, ``results/actor_update/README.md``): it unpacked two results where flash-attn-4 4.0.0b36's forward returns
five, and it refused every backward that names a window, which torch's ``varlen_attn`` always does (``(-1, 0)`` is its
causal mask, ``(-1, -1)`` none). Its forward also handed FA2's window convention to FA4 unchanged: FA2 writes "no limit"
as -1 where FA4 takes None, and FA4 4.0.0b36's ``_resolve_causal_local_window`` reads ``(-1, 0)`` as a local band from
one past the diagonal to the diagonal, which by FA4's mask code holds no key at all (read in its source, not run).

So repro registers kernels of its own for ``aten::_flash_attention_forward`` and ``aten::_flash_attention_backward``
on CUDA, the two ops under torch's varlen attention (repro's packed attention) and, below it, SDPA's flash path. They
put the causality and window in FA4's terms (:func:`fa4_window`), pass the tensors in the layouts both sides share
(``[total, heads, dim]`` with cumulative lengths, or ``[batch, seq, heads, dim]``: aten's and FA4's alike), and keep
FA4's leading results. Registration goes through torch's flash attention registry (:func:`register` is its
``register_fn``), so ``torch.nn.attention.current_flash_attention_impl`` reads :data:`NAME` back and
``restore_flash_attention_impl`` removes the kernels. With these kernels in place the ops have no FA2 to fall back
to: what FA4 cannot run (dropout, a debug mask, ALiBi, a paged KV cache) raises a ``RuntimeError`` naming it.

flash-attn-4 (the ``gpu`` extra) is imported by :func:`register` only: this module imports on CPU, where its tests run
the glue with stand-in kernels under the CPU dispatch key (``tests/unit/workers/test_fa4_kernels.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

NAME = "repro_fa4"
"""The name in torch's flash attention registry (read back in the engine report's ``flash_attention``)."""

MODULE = "flash_attn.cute.interface"
"""The kernels' module in the ``flash-attn-4`` package."""


def fa4_window(is_causal: bool, left: int | None, right: int | None) -> tuple[bool, int | None, int | None]:
    """aten's ``is_causal`` and window, in FA2's terms (-1: no limit; ``(-1, 0)``: causal), as FA4's ``(causal, left,
    right)`` (None: no limit; a band with no left limit and right edge 0 is ``causal``, FA4's own reading of it)."""
    left = None if left is None or left < 0 else int(left)
    right = 0 if is_causal else (None if right is None or right < 0 else int(right))
    if left is None and right == 0:
        return True, None, None
    return False, left, right


def _refuse(**unsupported: bool) -> None:
    named = [name for name, present in unsupported.items() if present]
    if named:
        raise RuntimeError(f"model.flash_attention=fa4: FlashAttention-4 does not run {', '.join(named)}, and with "
                           "its kernels behind aten's flash ops there is no FA2 to fall back to; use 'torch'")


def _int32(cu: torch.Tensor | None) -> torch.Tensor | None:
    return None if cu is None else cu.to(torch.int32).contiguous()


class Glue:
    """aten's flash-op kernels over one forward and one backward of FA4's form (``_flash_attn_fwd``,
    ``_flash_attn_bwd`` of ``flash_attn.cute.interface``); the tests pass stand-ins."""

    def __init__(self, fwd: Callable[..., tuple], bwd: Callable[..., tuple]) -> None:
        self.fwd, self.bwd = fwd, bwd

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cum_seq_q: torch.Tensor | None,
                cum_seq_k: torch.Tensor | None, max_q: int, max_k: int, dropout_p: float, is_causal: bool,
                return_debug_mask: bool, *, scale: float | None = None, window_size_left: int | None = None,
                window_size_right: int | None = None, seqused_k: torch.Tensor | None = None,
                alibi_slopes: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
                num_splits: int | None = None) -> tuple[torch.Tensor, ...]:
        """``aten::_flash_attention_forward``. ``num_splits`` is FA2's split-KV hint for decoding: no effect on the
        result, so FA4 picks its own."""
        _refuse(dropout=dropout_p != 0.0, **{"a debug mask": return_debug_mask, "ALiBi": alibi_slopes is not None,
                                            "a paged KV cache": block_table is not None})
        causal, left, right = fa4_window(is_causal, window_size_left, window_size_right)
        varlen = cum_seq_q is not None
        out, lse, *_ = self.fwd(query.contiguous(), key.contiguous(), value.contiguous(),
                                cu_seqlens_q=_int32(cum_seq_q), cu_seqlens_k=_int32(cum_seq_k),
                                max_seqlen_q=int(max_q) if varlen else None,
                                max_seqlen_k=int(max_k) if varlen else None, seqused_k=seqused_k,
                                softmax_scale=scale, causal=causal, window_size_left=left,
                                window_size_right=right, return_lse=True)
        # no dropout, so no random state: FA2's shapes for it (aten's meta function), zeros
        seed = torch.zeros(2, dtype=torch.uint64, device=query.device)
        offset = torch.zeros((), dtype=torch.uint64, device=query.device)
        return out, lse, seed, offset, torch.empty(0, dtype=query.dtype, device=query.device)

    def backward(self, grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 out: torch.Tensor, logsumexp: torch.Tensor, cum_seq_q: torch.Tensor, cum_seq_k: torch.Tensor,
                 max_q: int, max_k: int, dropout_p: float, is_causal: bool, rng_state: torch.Tensor,
                 unused: torch.Tensor, *, scale: float | None = None, window_size_left: int | None = None,
                 window_size_right: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``aten::_flash_attention_backward``: the gradients of query, key and value."""
        _refuse(dropout=dropout_p != 0.0)
        causal, left, right = fa4_window(is_causal, window_size_left, window_size_right)
        varlen = cum_seq_q is not None and cum_seq_q.numel() > 0  # aten passes empty tensors for the dense form
        dq, dk, dv, *_ = self.bwd(query.contiguous(), key.contiguous(), value.contiguous(), out.contiguous(),
                                  grad_out.contiguous(), logsumexp.contiguous(), softmax_scale=scale, causal=causal,
                                  window_size_left=left, window_size_right=right,
                                  cu_seqlens_q=_int32(cum_seq_q) if varlen else None,
                                  cu_seqlens_k=_int32(cum_seq_k) if varlen else None,
                                  max_seqlen_q=int(max_q) if varlen else None,
                                  max_seqlen_k=int(max_k) if varlen else None,
                                  # as aten's FA2 backward reads it: torch.use_deterministic_algorithms
                                  deterministic=torch.are_deterministic_algorithms_enabled())
        return dq, dk, dv  # a learnable sink's gradient would come fourth: repro has none

    def register(self, dispatch_key: str = "CUDA") -> Handle:
        """The two ops' kernels for ``dispatch_key``, until the handle's ``remove``."""
        lib = torch.library.Library("aten", "IMPL", dispatch_key)  # noqa: TOR901 (overriding aten's own kernels)
        lib.impl("_flash_attention_forward", self.forward, dispatch_key)
        lib.impl("_flash_attention_backward", self.backward, dispatch_key)
        return Handle(lib)


class Handle:
    """What torch's registry keeps while the kernels are active (its ``FlashAttentionHandle``)."""

    def __init__(self, lib: torch.library.Library) -> None:
        self._lib: Any = lib

    def remove(self) -> None:
        if self._lib is not None:
            self._lib._destroy()  # unregisters the kernels: aten's own FA2 serves the ops again
            self._lib = None


def register() -> Handle:
    """FA4's kernels behind the two ops on CUDA: the ``register_fn`` repro gives torch's registry under :data:`NAME`."""
    from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd

    return Glue(_flash_attn_fwd, _flash_attn_bwd).register("CUDA")
