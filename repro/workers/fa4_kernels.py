"""FlashAttention-4's kernels in the form torch's FA4 glue calls them (``model.flash_attention=fa4``).

torch's flash attention registry (``torch.nn.attention._fa4``, torch 2.11-2.13) imports a module and calls its
``_flash_attn_fwd`` expecting ``(out, lse)`` and its ``_flash_attn_bwd`` expecting ``(dq, dk, dv)``. The
``flash-attn-4`` releases after that glue was written return more: 4.0.0b36's forward gives
``(out, lse, p, row_max, o_lo)``, and on the H200 (session 25, ``results/actor_update/README.md``) torch 2.11's
glue failed on it with ``too many values to unpack``. :func:`repro.workers.varlen.activate` registers this
module in the glue's place; it passes every argument through and keeps the leading results, so the glue works with
the releases of either form. flash-attn-4 is imported on the first call only: this module imports on CPU.
"""

from __future__ import annotations

from typing import Any

MODULE = "flash_attn.cute.interface"
"""The kernels' module in the ``flash-attn-4`` package (the ``gpu`` extra)."""


def _flash_attn_fwd(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
    from flash_attn.cute.interface import _flash_attn_fwd as forward

    out, lse, *_ = forward(*args, **kwargs)
    return out, lse


def _flash_attn_bwd(*args: Any, **kwargs: Any) -> tuple[Any, Any, Any]:
    from flash_attn.cute.interface import _flash_attn_bwd as backward

    dq, dk, dv, *_ = backward(*args, **kwargs)  # a learnable sink's gradient would come fourth: repro has none
    return dq, dk, dv
