"""The twin-program table's own check of a rank that raises: it looks for what the report prints."""

from __future__ import annotations

from tests.collectives_programs.run_table import expected_raises, expected_sites, sites_shown

_TRACEBACK = (
    "rank 1 raised ValueError: batch 1 on rank 1 has no rows\n"
    "Traceback (most recent call last):\n"
    '  File "/x/tests/collectives_programs/raises.py", line 16, in <module>\n'
    "    batch = load_batch(rank, step)\n"
    '  File "/x/tests/collectives_programs/raises.py", line 10, in load_batch\n'
    '    raise ValueError(f"batch {step} on rank {rank} has no rows")  # raises: 1\n'
    "ValueError: batch 1 on rank 1 has no rows\n"
)
_TRACE_PART = (
    "What the collective trace saw (the peers of a rank that raised wait for it):\n"
    "Rank 1 never issued all_reduce (rank 0's call #2 on group 0 (global ranks [0, 1]))\n"
)


def test_the_raises_row_is_marked_by_the_raising_line_not_as_a_call_site():
    assert expected_raises("raises") == [(1, 10)]
    assert expected_sites("raises") == []


def test_the_raises_row_passes_on_the_report_as_printed_and_fails_when_the_exception_does_not_lead():
    assert sites_shown("raises", _TRACEBACK + "\n" + _TRACE_PART)
    assert not sites_shown("raises", _TRACE_PART + _TRACEBACK)  # the trace's finding first
    assert not sites_shown("raises", _TRACEBACK.replace("line 10,", "line 11,") + _TRACE_PART)
    assert not sites_shown("raises", _TRACEBACK.replace("rank 1 raised", "rank 0 raised"))
