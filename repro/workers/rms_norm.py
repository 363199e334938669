"""Fused RMSNorm on CUDA in half precision: torch's ``F.rms_norm`` in place of transformers' eager norm.

transformers' ``Qwen3RMSNorm`` (and the Llama/Qwen2 ones it copies) runs each norm as separate
kernels: an fp32 upcast, ``pow``, ``mean``, ``rsqrt``, two multiplies and a downcast, again in the
recomputation of activation checkpointing, and as many again backwards. Qwen3 has four norms a
layer (input, post-attention, q and k). On an H100 the 0.6B actor update spent as much kernel time
in the norms as in attention (101 vs 100 ms, ``results/actor_update/README.md``), and every one of
those small kernels is a launch on a host-bound step. ``F.rms_norm`` on CUDA is one fused kernel
forward and one backward (fp32 accumulation inside).

Error model (bf16 or fp16 input ``x``, weight ``w`` of the same dtype): transformers normalises in
fp32, rounds ``x_hat`` to the input dtype, multiplies by ``w`` and rounds again; the fused kernel
multiplies in fp32 and rounds once, so each element is within one rounding (``2**-8`` relative in bf16)
of the exact norm, plus fp32 summation order in the mean (~1e-7); the two forms differ by at most one
unit in the last place (``2**-7`` relative in bf16 at worst). The tests check the fused form against an
fp64 norm, forward and both gradients, with that bound.

CPU runs and fp32 keep transformers' own forward: the exact path every CPU proof and golden uses.
:func:`enable` sets the fused forward on the module instances (the class, and so any other model
of the process, is untouched); :func:`fused_count` reads back how many norms run it.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

MODES = ("auto", "fused", "eager")
MODE = "auto"
"""``auto``: fused on CUDA in half precision only; ``fused``: everywhere (the remove-padding benchmark
counts the host work of the fused form on CPU); ``eager``: never (the same benchmark's baseline on GPU)."""

_MARK = "_repro_fused_rms_norm"


def supported(dtype: torch.dtype) -> bool:
    """True on CUDA workers in half precision (``MODE`` ``auto``): where the fused kernel pays and the CPU
    path stays exact; ``MODE`` forces either answer."""
    from repro.devices import on_cpu

    if MODE not in MODES:
        raise ValueError(f"repro.workers.rms_norm.MODE={MODE!r} is not valid; choose one of {list(MODES)}")
    if MODE != "auto":
        return MODE == "fused"
    return dtype in (torch.bfloat16, torch.float16) and not on_cpu()


# transformers' norms whose forward is exactly ``weight * normalise(x)`` with ``variance_epsilon``
# (the Llama form Qwen3 copies). Not matched by name pattern: Gemma's norm scales by ``1 + weight``,
# gated norms take a second input, and a fused forward there would be wrong, not slower.
_LLAMA_FORM = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Qwen3MoeRMSNorm"})


def is_rms_norm(module: torch.nn.Module) -> bool:
    """One of transformers' Llama-form RMSNorms (``_LLAMA_FORM``), with its ``weight`` and ``variance_epsilon``."""
    return (type(module).__name__ in _LLAMA_FORM and isinstance(getattr(module, "weight", None), torch.Tensor)
            and hasattr(module, "variance_epsilon"))


def _fused_forward(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    # The normalised shape comes from the input: under ZeRO-3 the weight is a gathered partition
    # whose own ``shape`` outside the forward says nothing.
    return F.rms_norm(hidden_states, hidden_states.shape[-1:], self.weight, self.variance_epsilon)


def enable(module: torch.nn.Module) -> int:
    """Give every RMSNorm of ``module`` the fused forward; returns how many it changed."""
    count = 0
    for sub in module.modules():
        if is_rms_norm(sub) and not getattr(sub, _MARK, False):
            sub.forward = types.MethodType(_fused_forward, sub)
            setattr(sub, _MARK, True)
            count += 1
    return count


def fused_count(module: torch.nn.Module) -> int:
    """How many norms of ``module`` run the fused forward (the engine report's read-back)."""
    return sum(1 for sub in module.modules() if getattr(sub, _MARK, False))
