"""Alignment of per-rank call sequences: first divergence, extra calls without a cascade."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from repro.collectives.analyze.align import WINDOW, first_divergence
from repro.collectives.analyze.report import headline
from tests.unit.collectives.helpers import trace

AR4, BC4, AR1 = ("all_reduce", 4), ("broadcast", 4), ("all_reduce", 1)


def test_identical_sequences_have_no_divergence():
    assert first_divergence({0: trace(0, [AR4, BC4, AR4]), 1: trace(1, [AR4, BC4, AR4])}) is None


def test_size_mismatch_is_reported_with_differing_field_and_context():
    d = first_divergence({0: trace(0, [AR4, BC4, AR1]), 1: trace(1, [AR4, BC4, ("all_reduce", 8)])})
    assert d.kind == "mismatch" and d.differing == ["numel"]
    assert (d.call_a.numel, d.call_b.numel, d.call_a.group_seq) == (1, 8, 3)
    assert [c.op for c, _ in d.before] == ["all_reduce", "broadcast"]


def test_one_extra_call_is_one_gap_not_a_cascade():
    body = [BC4, ("all_gather_into_tensor", 8), AR4, BC4, ("reduce_scatter_tensor", 16)]
    a = trace(0, [AR4, ("all_reduce", 1, "loss.py:3 metrics"), *body])
    b = trace(1, [AR4, *body])
    d = first_divergence({0: a, 1: b})
    assert d.kind == "extra" and (d.rank_a, d.rank_b) == (0, 1)
    assert [c.site for c in d.extra_calls] == ["loss.py:3 metrics"]
    assert headline(d).startswith("Rank 0 issued one extra all_reduce")


def test_extra_call_on_the_higher_rank_names_that_rank():
    d = first_divergence(
        {0: trace(0, [AR4, BC4, AR4]), 1: trace(1, [AR4, ("barrier", 0), ("barrier", 0), BC4, AR4])}
    )
    assert d.kind == "extra" and d.rank_a == 1 and len(d.extra_calls) == 2
    assert "two extra calls" in headline(d)


def test_extra_call_with_equal_fingerprint_is_found_by_its_call_site():
    # The extra all_reduce looks exactly like the next one; only its site tells them apart.
    a = trace(0, [AR4, ("all_reduce", 4, "extra.py:1 f"), ("all_reduce", 4, "common.py:9 g"), BC4])
    b = trace(1, [AR4, ("all_reduce", 4, "common.py:9 g"), BC4])
    d = first_divergence({0: a, 1: b})
    assert d.kind == "extra" and d.call_a.site == "extra.py:1 f"


def test_rank_whose_record_ends_is_reported_as_stopped_with_its_last_call():
    a = trace(0, [AR4, BC4, AR4])
    b = trace(1, [AR4, BC4])
    b.calls[-1].t_end = None
    d = first_divergence({0: a, 1: b})
    assert d.kind == "stopped" and d.rank_b == 1 and d.last_b.op == "broadcast"
    assert "never returned" in headline(d)


def test_a_rank_one_call_ahead_of_a_peer_whose_last_call_returned_reads_as_a_stop_or_a_hang():
    # As a time limit left a traced 4-GPU run (results/4gpu/README.md): rank 0 waits in the next call.
    a = trace(0, [AR4, BC4, AR4])
    a.calls[-1].t_end = None
    d = first_divergence({0: a, 1: trace(1, [AR4, BC4])})
    assert d.kind == "stopped"
    text = headline(d)
    assert "Rank 0 is one call ahead" in text and "stopped from outside" in text and "rank 1 is the one" in text
    # Not so when the peer's own last call is still open, or when the rank is more than one call ahead.
    b = trace(1, [AR4, BC4])
    b.calls[-1].t_end = None
    assert "one call ahead" not in headline(first_divergence({0: a, 1: b}))
    far = trace(0, [AR4, BC4, AR4, BC4])
    far.calls[-1].t_end = None
    assert "one call ahead" not in headline(first_divergence({0: far, 1: trace(1, [AR4, BC4])}))


def test_divergence_far_beyond_the_alignment_window_is_found():
    n = 3 * WINDOW + 7
    a = trace(0, [AR4] * n + [AR1])
    b = trace(1, [AR4] * n + [("all_reduce", 2)])
    d = first_divergence({0: a, 1: b})
    assert d.kind == "mismatch" and d.call_a.group_seq == n + 1


@given(
    prefix=st.lists(st.sampled_from([AR4, BC4, ("barrier", 0), ("all_gather_into_tensor", 8)]), max_size=30),
    suffix=st.lists(st.sampled_from([AR4, BC4, ("all_gather_into_tensor", 8)]), min_size=1, max_size=30),
)
def test_a_single_inserted_call_is_always_reported_as_extra_on_that_rank(prefix, suffix):
    extra = ("all_reduce", 1, "extra.py:1 f")
    d = first_divergence({0: trace(0, prefix + suffix), 1: trace(1, prefix + [extra] + suffix)})
    assert d.kind == "extra" and d.rank_a == 1 and [c.site for c in d.extra_calls] == ["extra.py:1 f"]


def test_identical_calls_from_different_lines_are_noted_not_reported():
    from repro.collectives.analyze.align import first_site_difference

    traces = {
        0: trace(0, [AR4, ("broadcast", 4, "a.py:3 f")]),
        1: trace(1, [AR4, ("broadcast", 4, "b.py:9 g")]),
    }
    assert first_divergence(traces) is None
    note = first_site_difference(traces)
    assert "call #2 on group 0" in note and "a.py:3 f on rank 0" in note and "b.py:9 g on rank 1" in note
    assert first_site_difference({0: trace(0, [AR4]), 1: trace(1, [AR4])}) is None


def test_a_root_and_its_peers_in_two_branches_of_one_function_are_not_noted():
    from dataclasses import replace

    from repro.collectives.analyze.align import first_site_difference

    def rooted(rank: int, site: str, root: int = 0):
        t = trace(rank, [AR4, ("broadcast", 4, site)])
        t.calls[1] = replace(t.calls[1], root=root)
        return t

    # vLLM's in_the_same_node_as: the root broadcasts on one line, the others receive on another.
    same_function = {0: rooted(0, "vllm/parallel_state.py:2158 in_the_same_node_as"),
                     1: rooted(1, "vllm/parallel_state.py:2168 in_the_same_node_as")}
    assert first_divergence(same_function) is None and first_site_difference(same_function) is None
    # Still noted: a root and a peer in two functions, and an unrooted collective on two lines of one function.
    two_functions = {0: rooted(0, "a.py:3 send"), 1: rooted(1, "a.py:9 receive")}
    assert "a.py:3 send on rank 0" in first_site_difference(two_functions)
    unrooted = {0: trace(0, [AR4, ("all_reduce", 4, "a.py:3 f")]), 1: trace(1, [AR4, ("all_reduce", 4, "a.py:5 f")])}
    assert "a.py:3 f on rank 0" in first_site_difference(unrooted)
