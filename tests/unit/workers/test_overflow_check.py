"""``repro.workers.overflow_check``: one reduction answers DeepSpeed's per-tensor inf / NaN test, tensor list by list."""

from __future__ import annotations

import math

import pytest
import torch
from deepspeed.runtime.utils import has_inf_or_nan
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
from hypothesis import given
from hypothesis import strategies as st

from repro.workers.overflow_check import any_nonfinite, fuse, overflow_check

SPECIALS = (math.nan, math.inf, -math.inf)


@st.composite
def gradient_lists(draw) -> list[torch.Tensor]:
    """1-6 tensors of 0-40 elements (bf16 or fp32, some of them large finite), each maybe holding NaN or +-inf."""
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    out = []
    for _ in range(draw(st.integers(1, 6))):
        n = draw(st.integers(0, 40))
        seed = draw(st.integers(0, 2**16))
        scale = draw(st.sampled_from([1e-3, 1.0, 1e30]))  # 1e30: finite, though its square is not in fp32
        t = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * scale
        if n and draw(st.booleans()):
            t[draw(st.integers(0, n - 1))] = draw(st.sampled_from(SPECIALS))
        out.append(t.to(dtype))
    return out


@given(gradient_lists())
def test_the_one_reduction_answers_as_deepspeeds_per_tensor_test(grads: list[torch.Tensor]) -> None:
    expected = any(bool(has_inf_or_nan(g)) for g in grads)  # DeepSpeed 0.19.8's own function, tensor by tensor
    got = any_nonfinite(grads, "cpu")
    assert got.shape == (1,) and got.dtype == torch.bool and got.device.type == "cpu"
    assert bool(got) is expected


def test_no_gradients_or_only_empty_ones_are_no_overflow() -> None:
    assert not bool(any_nonfinite([], "cpu")) and not bool(any_nonfinite([torch.empty(0)], "cpu"))


class _ZeroOptimizer(DeepSpeedZeroOptimizer):
    """DeepSpeed's ZeRO-1/2 optimizer class with only the two attributes the fused test reads (its own
    ``__init__`` needs a process group and a model; the real engines are tests/distributed/'s)."""

    def __init__(self, groups: dict[int, list[torch.Tensor]]) -> None:  # noqa: D107 - no super().__init__
        self.averaged_gradients, self.device = groups, "cpu"


@pytest.mark.parametrize("poison", [None, math.nan, -math.inf])
def test_fuse_replaces_the_loop_on_that_optimizer_over_every_group(poison: float | None) -> None:
    groups = {0: [torch.ones(3), None], 1: [torch.zeros(2), torch.full((4,), 2.0)]}
    if poison is not None:
        groups[1][1][2] = poison  # the last group's last tensor: every group is read
    opt = _ZeroOptimizer(groups)
    assert overflow_check(opt) == "per_tensor" and overflow_check(object()) is None
    fuse(opt)
    assert overflow_check(opt) == "fused"
    assert bool(opt.has_overflow_partitioned_grads_serial()) is (poison is not None)
