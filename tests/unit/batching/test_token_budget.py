"""Token-budget micro-batches: no sample lost or duplicated, the budget held, equal counts on every rank."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from repro.batching.token_budget import (
    equalize_micro_batch_counts,
    min_micro_batches,
    split_micro_batches_by_tokens,
)
from tests.strategies import token_lengths


def _check_partition(bins: list[list[int]], lens: list[int], budget: int) -> None:
    flat = [i for b in bins for i in b]
    assert sorted(flat) == list(range(len(lens))), "a sample was lost or duplicated"
    assert all(b for b in bins), "empty micro-batch"
    assert all(sum(lens[i] for i in b) <= budget for b in bins)


@given(token_lengths(), st.integers(1, 2048))
def test_token_packing_keeps_every_sample_once_and_no_bin_over_budget(lens, budget):
    assume(all(x <= budget for x in lens))
    bins = split_micro_batches_by_tokens(lens, budget)
    _check_partition(bins, lens, budget)
    assert bins == split_micro_batches_by_tokens(list(lens), budget), "not deterministic"
    # First-fit quality: all bins but one are more than half full, so count <= 2 * total / budget + 1.
    assert len(bins) <= 2 * sum(lens) / budget + 1


@given(token_lengths(max_size=32), st.integers(1, 1024), st.data())
def test_token_packing_to_a_given_count_makes_exactly_that_many_bins(lens, budget, data):
    assume(lens and all(x <= budget for x in lens))
    k = data.draw(st.integers(min_micro_batches(lens, budget), len(lens)))
    bins = split_micro_batches_by_tokens(lens, budget, num_micro_batches=k)
    assert len(bins) == k
    _check_partition(bins, lens, budget)


@given(token_lengths(max_size=32), st.integers(1, 512))
def test_a_sequence_over_the_token_budget_is_an_error_naming_the_key(lens, budget):
    assume(any(x > budget for x in lens))
    with pytest.raises(ValueError, match="ppo_max_token_len_per_gpu"):
        split_micro_batches_by_tokens(lens, budget)


def test_token_packing_balances_loads():
    # First-fit decreasing alone gives loads 16, 16, 14; balancing gives 16, 15, 15.
    lens = [9, 8, 7, 6, 5, 4, 3, 2, 1, 1]
    bins = split_micro_batches_by_tokens(lens, 16)
    loads = sorted(sum(lens[i] for i in b) for b in bins)
    assert len(bins) == math.ceil(sum(lens) / 16) == 3
    assert loads == [15, 15, 16]


@given(
    st.lists(token_lengths(max_len=256, max_size=16), min_size=1, max_size=4),
    st.integers(256, 1024),
    st.data(),
)
def test_equalized_micro_batch_counts_are_the_same_on_every_rank(per_rank, budget, data):
    size = data.draw(st.integers(1, 16))
    per_rank = [(lens * size)[:size] if lens else [1] * size for lens in per_rank]
    out = equalize_micro_batch_counts(per_rank, budget)
    counts = {len(bins) for bins in out}
    assert counts == {max(min_micro_batches(lens, budget) for lens in per_rank)}
    for bins, lens in zip(out, per_rank, strict=True):
        _check_partition(bins, lens, budget)


def test_equalize_refuses_ranks_with_too_few_samples():
    with pytest.raises(ValueError, match="same number of samples"):
        equalize_micro_batch_counts([[10, 10, 10], [1]], 10)
