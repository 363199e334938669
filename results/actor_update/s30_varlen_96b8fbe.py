"""FlashAttention over packed rows on CUDA (``use_remove_padding``): torch's ``varlen_attn``.

Without an attention mask, transformers' ``sdpa`` attention turns the ``position_ids`` of packed
rows into a 4-D block-causal mask, and SDPA with an arbitrary mask runs its memory-efficient or
math kernel instead of FlashAttention: packing saves tokens but each token costs more. torch's
``torch.nn.attention.varlen.varlen_attn`` (FlashAttention-2 over ``cu_seqlens``, bf16/fp16 on
CUDA) attends within each sample directly. :func:`enable` registers :func:`attention` under a
key of its own and sets it on one model only (the rollout copy in the same process keeps its
own attention), with no mask built at all.

The samples come from the ``position_ids``: a sample starts wherever the position does not
grow by one (the rule of :mod:`repro.workers.ulysses`), and every row starts one. The pad
tokens of a row's tail sit at position 0, each a one-token sample that no real token sees.
The boundaries are computed once per forward (two host syncs: their count and the longest) and reused by
every layer, and by the recomputation of gradient checkpointing.

The kernels behind torch's flash ops are torch's own FlashAttention-2 unless ``model.flash_attention=fa4`` puts
FlashAttention-4 (the ``flash-attn-4`` package, CuTe DSL kernels for Hopper and Blackwell; the ``gpu`` extra) there
with repro's glue (:mod:`repro.workers.fa4_kernels`, through torch's flash attention registry: :func:`activate`): the
varlen op, its backward and SDPA's flash path then run FA4 in this whole process, the module code here unchanged.
On one H200, torch's FA2 kernels ran the 0.6B shape's attention at about 11% of their ideal, FA4's at 15% in the
update and 22% in the log-prob pass (``results/actor_update/README.md``, sessions 24-26).

CPU runs and fp32 keep the exact ``sdpa``/``eager`` path. Ulysses sequence parallelism uses
:func:`attention` as its core attention over the gathered sequence (:mod:`repro.workers.ulysses`)
under the same conditions, whether or not the rows are packed.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any

import torch

from repro.workers import fa4_kernels

KEY = "repro_varlen"
ENABLED = True
"""Use the varlen path where it is supported (the remove-padding benchmark turns it off to
measure the ``sdpa`` path on the same GPU)."""


def _varlen_attn() -> Any:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def supported(dtype: torch.dtype) -> bool:
    """True when this process can run the varlen path: CUDA workers, half precision, torch's varlen op."""
    from repro.devices import on_cpu

    return ENABLED and dtype in (torch.bfloat16, torch.float16) and not on_cpu() and _varlen_attn() is not None


def cu_seqlens(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``int32`` cumulative sample lengths over the flattened ``[rows, L]`` positions, and the longest."""
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = (position_ids[:, 1:] - position_ids[:, :-1]) != 1
    first = starts.reshape(-1).nonzero().squeeze(-1)
    total = first.new_full((1,), position_ids.numel())  # made on the device: no host copy to wait for
    bounds = torch.cat([first, total])
    return bounds.to(torch.int32), int((bounds[1:] - bounds[:-1]).max())


_cache: tuple[torch.Tensor, torch.Tensor, int] | None = None
"""(position_ids, cu_seqlens, longest) of the last forward: the layers share one tensor object,
and holding it keeps its memory from being reused by another batch's positions."""


def _boundaries(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    global _cache
    if _cache is None or _cache[0] is not position_ids:
        _cache = (position_ids, *cu_seqlens(position_ids))
    return _cache[1], _cache[2]


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: Any, dropout: float = 0.0, scaling: float | None = None,
              sliding_window: int | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention function: ``[b, H, L, D]`` q/k/v -> ``[b, L, H, D]``, causal within each sample."""
    if dropout or sliding_window:
        raise ValueError(f"{KEY} attention supports neither dropout nor a sliding window "
                         f"(got dropout={dropout}, sliding_window={sliding_window})")
    cu, longest = _boundaries(kwargs["position_ids"])
    b, heads, length, dim = query.shape
    q = query.transpose(1, 2).reshape(b * length, heads, dim)
    k = key.transpose(1, 2).reshape(b * length, key.shape[1], dim)
    v = value.transpose(1, 2).reshape(b * length, value.shape[1], dim)
    return packed(q, k, v, cu, longest, scaling).view(b, length, heads, dim), None


@functools.cache
def _params(fn: Any) -> Any:
    return inspect.signature(fn).parameters


def packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, longest: int,
           scaling: float | None = None) -> torch.Tensor:
    """torch's ``varlen_attn`` over ``[total, heads, dim]`` q/k/v, causal within each sample of ``cu``: the call
    :func:`attention` makes (and ``python -m repro.bench.attention_calls`` times)."""
    fn = _varlen_attn()
    params = _params(fn)
    heads, dim = q.shape[1], q.shape[2]
    extra: dict[str, Any] = {}
    # Fewer KV heads than query heads go to FlashAttention as they are: its kernels share each KV head among its
    # group of query heads (and sum their gradients). torch versions whose varlen_attn has no enable_gqa pass the
    # tensors straight to the same kernels. Repeating K and V to the query's heads instead cost more than the
    # attention itself at the 0.6B shape (a copy kernel of 27 ms per log-prob pass on an H200, the kernel at 12.6:
    # results/actor_update/README.md, session 17).
    if k.shape[1] != heads and "enable_gqa" in params:
        extra["enable_gqa"] = True
    # torch 2.10 names causality is_causal; later versions a (left, right) window
    extra.update({"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True})
    if scaling is not None:
        if "scale" in params:
            extra["scale"] = scaling
        elif abs(scaling - dim ** -0.5) > 1e-12:
            raise ValueError(f"{KEY} attention: this torch's varlen_attn has no scale argument (scaling={scaling})")
    return fn(q, k, v, cu, cu, longest, longest, **extra)


FLASH_IMPLS = {"torch": None, "fa4": fa4_kernels.NAME}
"""``model.flash_attention`` -> the name of torch's flash attention registry (None: torch's bundled FA2)."""


def current_impl() -> str:
    """The flash kernels torch's flash ops dispatch to in this process, read back from torch's registry:
    ``torch`` (its bundled FlashAttention-2) or the registry's name of the active one (``repro_fa4``: repro's FA4 glue)."""
    try:
        from torch.nn.attention import current_flash_attention_impl
    except ImportError:  # torch before the registry (2.10): only its own kernels
        return "torch"
    return current_flash_attention_impl() or "torch"


def activate(choice: str, dtype: torch.dtype) -> str:
    """Put ``model.flash_attention``'s kernels behind torch's flash ops for this process where a role of ``dtype``
    can run them (:func:`supported`); the active ones read back.

    Process-wide by torch's design (a dispatcher override): every role in the process attends with them. Called
    again with the same choice it does nothing (torch's activation re-registers the kernels each time). Raises
    ``RuntimeError`` naming the key when this torch has no registry or the kernels' package is missing.
    """
    name = FLASH_IMPLS[choice]
    if name is None or not supported(dtype) or current_impl() == name:
        return current_impl()
    try:
        from torch.nn.attention import activate_flash_attention_impl, register_flash_attention_impl
    except ImportError as e:
        raise RuntimeError(f"model.flash_attention={choice}: torch {torch.__version__} has no flash attention registry "
                           f"(torch.nn.attention.activate_flash_attention_impl); use 'torch'") from e
    try:
        importlib.import_module(fa4_kernels.MODULE)  # here, not at the first attention call: a clear error up front
    except ImportError as e:
        raise RuntimeError(f"model.flash_attention={choice}: {e}; install the gpu extra "
                           f"(pip install '.[gpu]': flash-attn-4) or use 'torch'") from e
    register_flash_attention_impl(name, register_fn=fa4_kernels.register)
    activate_flash_attention_impl(name)
    return current_impl()


def engage(model: torch.nn.Module, choice: str, dtype: torch.dtype, packed_rows: bool) -> bool:
    """A role's attention as its config asks: ``choice``'s flash kernels for the process (:func:`activate`) and, where
    its micro-batches are packed rows without sequence parallelism (``packed_rows``) and this process can run it
    (:func:`supported`), the varlen path on ``model`` (:func:`enable`). True when the model attends with it: the
    attention mask is then never read, so the caller must not hand it padded rows. One rule for repro's workers and
    verl's engine (:mod:`repro.integrations.verl.engine`)."""
    activate(choice, dtype)
    on = packed_rows and supported(dtype)
    if on:
        enable(model)
    return on


def enable(model: torch.nn.Module) -> None:
    """Put :func:`attention` on ``model`` only (under its own key, with no mask built).

    No mask function is registered for the key on purpose: transformers then skips mask creation
    altogether (``_preprocess_mask_arguments``' early exit for attention without a mask function),
    where a registered one returning None still ran ``find_packed_sequence_indices`` first, a
    device sync and a few kernels on every forward.
    """
    from transformers import AttentionInterface

    AttentionInterface.register(KEY, attention)
    model.set_attn_implementation(KEY)
