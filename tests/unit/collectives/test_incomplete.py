"""Records that end without an answer are findings: a missing rank record, a call that never returned."""

from __future__ import annotations

from repro.collectives.analyze.findings import incomplete
from repro.collectives.analyze.report import format_divergence
from repro.collectives.events import RankTrace
from tests.unit.collectives.helpers import call, trace


def test_a_rank_without_a_record_is_reported_with_the_call_that_names_it():
    d = incomplete({0: trace(0, [("all_reduce", 4, "train.py:9 step")])})
    assert d.kind == "missing" and d.missing_ranks == [1] and d.rank_a == 0
    assert "Rank 1 left no record" in format_divergence(d) and "train.py:9 step" in format_divergence(d)


def test_a_rank_outside_every_recorded_group_is_not_missing():
    t = RankTrace(rank=1, calls=[call(1, 1, ranks=(1, 2))])
    t2 = RankTrace(rank=2, calls=[call(2, 1, ranks=(1, 2))])
    assert incomplete({1: t, 2: t2}) is None


def test_two_unreturned_receives_name_both_ranks_blocked_calls():
    a = RankTrace(rank=0, calls=[call(0, 1, returned=False, op="recv", site="p.py:5 main", t=2.0)])
    b = RankTrace(rank=1, calls=[call(1, 1, returned=False, op="recv", site="p.py:7 main", t=3.0)])
    a.calls[0].peer, b.calls[0].peer = 1, 0
    d = incomplete({0: a, 1: b})
    assert d.kind == "hang" and (d.rank_a, d.rank_b) == (0, 1)
    text = format_divergence(d)
    assert "p.py:5 main never returned; rank 1 is blocked in recv" in text and "p.py:7 main" in text


def test_every_call_returned_means_nothing_incomplete():
    assert incomplete({0: trace(0, [("all_reduce", 4)]), 1: trace(1, [("all_reduce", 4)])}) is None


def test_a_wait_that_never_returned_names_the_call_it_waits_for():
    stuck = call(0, 2, op="wait", returned=False, site="loop.py:20 train", t=5.0)
    stuck.group_seq, stuck.detail, stuck.of = None, ["for", "all_reduce", 1], 1
    a = RankTrace(rank=0, calls=[call(0, 1, site="loop.py:19 train"), stuck])
    b = RankTrace(rank=1, calls=[call(1, 1, site="loop.py:19 train")])
    d = incomplete({0: a, 1: b})
    assert d.kind == "hang" and d.call_a is stuck
    assert (
        "Rank 0's wait for all_reduce #1 numel=4 float32 at loop.py:20 train never returned"
        in format_divergence(d)
    )
