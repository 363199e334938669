"""All-to-all split sizes are compared pairwise: what rank i sends to j against what j expects from i."""

from __future__ import annotations

from repro.collectives.analyze.findings import split_mismatch
from repro.collectives.events import CallRecord


def _a2a(rank: int, send: list[int], recv: list[int]) -> CallRecord:
    return CallRecord(
        rank,
        1,
        "all_to_all_single",
        "0",
        (0, 1),
        1,
        sum(send),
        "float32",
        "a.py:1 f",
        detail=["splits", send, recv],
    )


def test_the_split_report_names_who_sends_what_to_whom():
    d = split_mismatch({0: _a2a(0, [2, 6], [2, 4]), 1: _a2a(1, [4, 4], [4, 4])}, "unit")
    assert d.differing == ["splits"] and (d.rank_a, d.rank_b) == (0, 1)
    assert "rank 0 sends 6 elements to rank 1, which expects 4" in d.source


def test_uneven_but_consistent_splits_agree():
    assert split_mismatch({0: _a2a(0, [2, 6], [2, 4]), 1: _a2a(1, [4, 4], [6, 4])}, "unit") is None
