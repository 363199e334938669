"""The varlen attention path's sample boundaries: one sample per run of positions growing by
one, every row starting one, so that FlashAttention over them is the block-causal attention
of the packed rows (the CUDA comparison is in tests/gpu_e2e/test_varlen_gpu.py)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.workers import varlen


@settings(max_examples=50, deadline=None)
@given(rows=st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=5), min_size=1, max_size=4),
       tail=st.integers(0, 3))
def test_cu_seqlens_delimit_the_packed_samples_and_row_tails(rows, tail):
    width = max(sum(r) for r in rows) + tail
    pos = torch.zeros(len(rows), width, dtype=torch.long)
    expected = []
    for r, lengths in enumerate(rows):
        col = 0
        for n in lengths:
            pos[r, col:col + n] = torch.arange(n)
            expected.append(n)
            col += n
        expected += [1] * (width - col)  # tail pads at position 0: one-token samples
    cu, longest = varlen.cu_seqlens(pos)
    assert cu.dtype == torch.int32
    assert (cu[1:] - cu[:-1]).tolist() == expected
    assert cu[0] == 0 and cu[-1] == pos.numel() and longest == max(expected)


def test_varlen_is_not_used_on_cpu_or_in_fp32():
    assert not varlen.supported(torch.bfloat16)  # the unit tests run with DS_ACCELERATOR=cpu
    assert not varlen.supported(torch.float32)
