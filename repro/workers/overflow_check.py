"""ZeRO-1/2's test of the gradients for inf / NaN before each optimizer step: one multi-tensor reduction.

DeepSpeed 0.19.8's ``DeepSpeedZeroOptimizer.step`` asks ``has_overflow_partitioned_grads_serial`` whether any
gradient holds a non-finite value, and that loops over the gradient tensors: per tensor ``amax``, ``amin``, two
``isfinite`` and the logical ops between them (``deepspeed.runtime.utils.has_inf_or_nan``), about a dozen small
operators each. At the Qwen3-0.6B shape's 310 tensors that is about 4,000 operators a step, each a kernel launch on
a GPU: in session 23's profile of the update on one H200 (``results/actor_update/README.md``) the optimizer phase
took 112.9 ms of host time, the GPU idle for 57.6 ms of it.
:func:`fuse` replaces the loop, on one optimizer, by :func:`torch.nn.utils.get_total_norm` with ``norm_type=inf``
over the same tensors (torch's multi-tensor ``_foreach_norm``: a few launches): the largest magnitude of all of
them, which is non-finite exactly when one element is NaN or infinite (the max propagates NaN), so the answer is
DeepSpeed's, True or False, and the step that follows is the same
(``tests/unit/workers/test_overflow_check.py``, ``tests/distributed/workers/test_nonfinite_grad.py``).

Imports torch; :func:`overflow_check` (the read-back) imports DeepSpeed's ZeRO-1/2 optimizer class to know one.
"""

from __future__ import annotations

import math
from typing import Any

import torch

FUSED = "fused"
PER_TENSOR = "per_tensor"


def any_nonfinite(grads: list[torch.Tensor], device: torch.device | str) -> torch.Tensor:
    """Whether any of ``grads`` holds a NaN or an infinity, as a one-element bool tensor on ``device`` (no host
    sync: DeepSpeed reduces it across ranks first)."""
    grads = [g for g in grads if g.numel()]  # an empty tensor holds no non-finite value (and has no max)
    if not grads:
        return torch.zeros(1, dtype=torch.bool, device=device)
    largest = torch.nn.utils.get_total_norm(grads, norm_type=math.inf, foreach=None)
    return (~torch.isfinite(largest)).reshape(1).to(device)


def fuse(optimizer: Any) -> None:
    """Make ``optimizer`` (DeepSpeed's ``DeepSpeedZeroOptimizer``) test its gradient partitions with
    :func:`any_nonfinite` instead of its per-tensor loop."""

    def has_overflow_partitioned_grads_serial() -> torch.Tensor:
        grads = [g for group in optimizer.averaged_gradients.values() for g in group if g is not None]
        return any_nonfinite(grads, optimizer.device)

    has_overflow_partitioned_grads_serial.repro_fused = True  # type: ignore[attr-defined]
    optimizer.has_overflow_partitioned_grads_serial = has_overflow_partitioned_grads_serial


def overflow_check(optimizer: Any) -> str | None:
    """``fused`` or DeepSpeed's ``per_tensor`` for a ZeRO-1/2 optimizer; None for any other (the engine's read-back:
    ZeRO-3's optimizer has a method of the same name but tests its flat gradient buffer instead)."""
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    if not isinstance(optimizer, DeepSpeedZeroOptimizer):
        return None
    method = optimizer.has_overflow_partitioned_grads_serial
    return FUSED if getattr(method, "repro_fused", False) else PER_TENSOR
