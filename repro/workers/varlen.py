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
The boundaries are computed once per forward (two host syncs: their count and the longest), by a forward pre-hook
of the model, before any decoder layer runs, and handed to every layer as transformers' flash-attention keyword
arguments (``cu_seq_lens_q`` ..., which its layers pass through to the attention function and gradient
checkpointing's recomputation reuses). Not inside the first layer's attention: with ``model.compile_layers`` that
sync was a graph break, and the first layer's path (compute) and the others' (reuse a cached tensor) were two
variants of one compiled function; with the inference and training variants the layers of verl's engine reached
dynamo's limit of 8 compilations on one H200 and ran eager beyond it (``results/verl_engine/README.md``).

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


BOUNDARY_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
"""transformers' flash-attention keyword arguments (``FlashAttentionKwargs``), which its models pass from their
``forward`` through every decoder layer to the attention function."""


def host_boundaries(positions: torch.Tensor, device: torch.device) -> dict[str, Any]:
    """:data:`BOUNDARY_KWARGS` of packed rows from their positions on the host (``PackedBatch.host_positions``):
    :func:`cu_seqlens` computed there and sent to ``device`` without waiting. :func:`with_boundaries` computes the
    same values from the device's positions, where the ``nonzero`` and the longest length waited for the device
    twice a forward (``results/actor_update/README.md``, session 34)."""
    cu, longest = cu_seqlens(positions)
    return _boundary_kwargs(cu.to(device, non_blocking=True), longest)


def _boundary_kwargs(cu: torch.Tensor, longest: int) -> dict[str, Any]:
    return dict(zip(BOUNDARY_KWARGS, (cu, cu, longest, longest), strict=True))


def with_boundaries(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict] | None:
    """Forward pre-hook (``with_kwargs``) of a model on the varlen path: the packed rows' boundaries from its
    ``position_ids``, once per forward and outside the decoder layers, as :data:`BOUNDARY_KWARGS`. A caller that
    passes them already, or no ``position_ids`` keyword (the layers then compute them: :func:`_boundaries`), is left
    as it is."""
    pos = kwargs.get("position_ids")
    if pos is None or BOUNDARY_KWARGS[0] in kwargs:
        return None
    return args, {**kwargs, **_boundary_kwargs(*cu_seqlens(pos))}


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: Any, dropout: float = 0.0, scaling: float | None = None,
              sliding_window: int | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention function: ``[b, H, L, D]`` q/k/v -> ``[b, L, H, D]``, causal within each sample."""
    if dropout or sliding_window:
        raise ValueError(f"{KEY} attention supports neither dropout nor a sliding window "
                         f"(got dropout={dropout}, sliding_window={sliding_window})")
    if kwargs.get(BOUNDARY_KWARGS[0]) is not None:  # the model's pre-hook (with_boundaries)
        cu, longest = kwargs[BOUNDARY_KWARGS[0]], kwargs[BOUNDARY_KWARGS[2]]
    else:  # Ulysses' gathered sequence, or a caller past the hook
        cu, longest = _boundaries(kwargs["position_ids"])
    b, heads, length, dim = query.shape
    q = query.transpose(1, 2).reshape(b * length, heads, dim)
    k = key.transpose(1, 2).reshape(b * length, key.shape[1], dim)
    v = value.transpose(1, 2).reshape(b * length, value.shape[1], dim)
    return packed(q, k, v, cu, longest, scaling).view(b, length, heads, dim), None


_param_names: tuple[Any, frozenset[str]] | None = None
"""(``varlen_attn``, the names it takes in this torch), read once before any compiled layer runs (:func:`enable`):
a compiled layer then reads a constant, where ``inspect.signature`` inside it cost dynamo a trace of its own."""


def _params(fn: Any) -> frozenset[str]:
    global _param_names
    if _param_names is None or _param_names[0] is not fn:
        _param_names = (fn, frozenset(inspect.signature(fn).parameters))
    return _param_names[1]


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
    device sync and a few kernels on every forward. The samples' boundaries come from a pre-hook on ``model``
    (:func:`with_boundaries`), once per forward.
    """
    from transformers import AttentionInterface

    AttentionInterface.register(KEY, attention)
    model.set_attn_implementation(KEY)
    if _varlen_attn() is not None:
        _params(_varlen_attn())
    if with_boundaries not in model._forward_pre_hooks.values():  # a second role setup on the same model: one hook
        model.register_forward_pre_hook(with_boundaries, with_kwargs=True)
