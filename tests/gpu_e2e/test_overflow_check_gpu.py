"""On CUDA, ZeRO-1/2's fused inf / NaN test (:mod:`repro.workers.overflow_check`: torch's multi-tensor
``_foreach_norm`` with ``norm_type=inf``, CUDA's own kernel rather than the CPU's per-tensor fallback) answers as
DeepSpeed's per-tensor ``has_inf_or_nan`` on gradient lists of the 0.6B shape's sizes: bf16 and fp32, a NaN or an
infinity in one tensor at its first, last or a middle element, or none, and large finite values whose square an
fp32 sum would not hold. The CPU suite proves the same on small lists
(``tests/unit/workers/test_overflow_check.py``). Run with ``REPRO_GPU_TESTS=1``.
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import require_cuda_gpus

pytestmark = pytest.mark.gpu

# Qwen3-0.6B's gradient tensors by size: the embedding, a q/o projection, an MLP matrix, a norm's weight
SIZES = (151_936 * 1024, 2048 * 1024, 3072 * 1024, 1024, 128)


@pytest.fixture(autouse=True)
def _cuda():
    require_cuda_gpus(1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("poison", [None, math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_the_fused_test_answers_as_deepspeeds_on_the_gpu(dtype: torch.dtype, poison: float | None, where: str) -> None:
    from deepspeed.runtime.utils import has_inf_or_nan

    from repro.workers.overflow_check import any_nonfinite

    gen = torch.Generator(device="cuda").manual_seed(0)
    grads = [torch.randn(n, device="cuda", generator=gen).to(dtype) for n in SIZES]
    grads[3].mul_(1e30)  # finite in both dtypes; its square is not, in fp32
    if poison is not None:
        target = grads[{"first": 0, "middle": 2, "last": 4}[where]]
        target[{"first": 0, "middle": target.numel() // 2, "last": -1}[where]] = poison
    expected = any(bool(has_inf_or_nan(g)) for g in grads)
    got = any_nonfinite(grads, "cuda")
    assert got.device.type == "cuda" and got.shape == (1,)
    assert bool(got) is expected is (poison is not None)
