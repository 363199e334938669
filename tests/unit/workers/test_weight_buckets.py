"""Weight bucketing: every tensor once, in order, each bucket within the budget unless it holds one oversized tensor."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.workers.weight_buckets import buckets, nbytes

_DTYPES = (torch.bfloat16, torch.float32, torch.int64)


@st.composite
def _named_tensors(draw):
    sizes = draw(st.lists(st.integers(min_value=0, max_value=300), min_size=0, max_size=25))
    dtypes = draw(st.lists(st.sampled_from(_DTYPES), min_size=len(sizes), max_size=len(sizes)))
    return [(f"w{i}", torch.zeros(n, dtype=d)) for i, (n, d) in enumerate(zip(sizes, dtypes, strict=True))]


@settings(max_examples=60)
@given(named=_named_tensors(), budget=st.integers(min_value=1, max_value=2000))
def test_buckets_keep_every_tensor_once_in_order_within_the_budget(named, budget):
    out = list(buckets(iter(named), budget))
    flat = [pair for bucket in out for pair in bucket]
    assert [n for n, _ in flat] == [n for n, _ in named]
    assert all(a is b for (_, a), (_, b) in zip(flat, named, strict=True))
    for bucket in out:
        assert bucket, "no empty bucket"
        size = sum(nbytes(t) for _, t in bucket)
        assert size <= budget or len(bucket) == 1
    # Greedy: a bucket closes only because the next tensor would not fit.
    for first, second in zip(out, out[1:], strict=False):
        assert sum(nbytes(t) for _, t in first) + nbytes(second[0][1]) > budget


def test_buckets_consume_the_stream_lazily():
    seen = []

    def stream():
        for i in range(4):
            seen.append(i)
            yield f"w{i}", torch.zeros(4, dtype=torch.float32)

    it = buckets(stream(), 32)
    assert [n for n, _ in next(it)] == ["w0", "w1"]
    assert seen == [0, 1, 2]  # the third tensor was read to close the first bucket, no more


def test_a_non_positive_budget_is_refused():
    with pytest.raises(ValueError, match="budget"):
        list(buckets([("w", torch.zeros(1))], 0))
