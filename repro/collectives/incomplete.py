"""Records that end without an answer: a rank with no record, or a call that never returned.

When the ranks' sequences align, the job can still have gone wrong: a rank that died before
its first traced call leaves no file while its peers' calls name it, and a job stopped as hung
leaves calls (or waits) that never returned - a point-to-point deadlock, a collective whose
peer is stuck in a call the tracer cannot see. Either is a finding, never "no divergence".
"""

from __future__ import annotations

from repro.collectives.align import Divergence
from repro.collectives.events import CallRecord, RankTrace


def _unreturned(trace: RankTrace) -> CallRecord | None:
    return next((c for c in trace.calls if c.t_end is None), None)


def _partner(call: CallRecord, rank: int, present: list[int]) -> int | None:
    if call.peer is not None:
        return call.peer
    if call.detail and call.op == "batch_isend_irecv":
        return call.detail[0][1]
    others = [r for r in call.ranks if r != rank]
    return next((r for r in others if r in present), others[0] if others else None)


def missing_rank(traces: dict[int, RankTrace]) -> Divergence | None:
    """A rank that recorded nothing although another rank's calls include it."""
    present = sorted(traces)
    for r in present:
        for c in traces[r].calls:
            absent = [m for m in (*c.ranks, *([c.peer] if c.peer is not None else [])) if m not in traces]
            if absent:
                return Divergence(
                    kind="missing",
                    group=c.group,
                    ranks=c.ranks,
                    rank_a=r,
                    rank_b=absent[0],
                    call_a=c,
                    missing_ranks=sorted(set(absent)),
                    source="trace: a rank left no record",
                )
    return None


def never_returned(traces: dict[int, RankTrace]) -> Divergence | None:
    """The earliest call that never returned, with what its partner rank was doing then."""
    present = sorted(traces)
    # Flight Recorder marks completion only where the backend reports it: no "never returned" there.
    ours = [r for r in present if traces[r].meta.get("format") != "flight_recorder"]
    stuck = [(c, r) for r in ours if (c := _unreturned(traces[r])) is not None]
    if not stuck:
        return None
    call, rank = min(stuck, key=lambda x: x[0].t)
    partner = _partner(call, rank, present)
    other = traces.get(partner) if partner is not None else None
    return Divergence(
        kind="hang",
        group=call.group,
        ranks=call.ranks,
        rank_a=rank,
        rank_b=partner if partner is not None else rank,
        call_a=call,
        call_b=_unreturned(other) if other is not None else None,
        last_b=other.last_call if other is not None else None,
        source="trace: a call never returned",
    )


def incomplete(traces: dict[int, RankTrace]) -> Divergence | None:
    """A missing rank record first (it explains the rest), else a call that never returned."""
    return missing_rank(traces) or never_returned(traces)
