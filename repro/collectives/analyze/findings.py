"""Findings: what a trace directory shows, and every finder beside the alignment.

:func:`analyze` reads a directory (our per-rank files, else Flight Recorder dumps) and returns
the earliest finding: a failure the live check recorded wins (it saw both ranks' calls before
they ran); otherwise the per-rank sequences are aligned (:mod:`repro.collectives.analyze.align`)
and the records' point-to-point pairs and all-to-all split sizes are matched, and the earliest
divergence of all wins; when they agree, Flight Recorder dumps beside the records show what ran
below the Python API, and a rank without a record or a call that never returned is the finding.

**Point-to-point pairing in the records**: the n-th send and the n-th receive of a channel are one
transfer (see :mod:`repro.collectives.events`). :func:`p2p_mismatch` finds a pair whose sizes or
dtypes differ, :func:`unreceived` a send that no receive of its channel took while its receiver
went on elsewhere (an extra send, or one sent to the wrong peer). :func:`pair_divergence` is the
report of a pair, live (:mod:`repro.collectives.check.pairs`) or from the records.

**All-to-all split sizes**: ``all_to_all_single`` with ``input_split_sizes``/``output_split_sizes``
(and ``all_to_all`` with per-peer tensors) legitimately moves different amounts per rank, so its
total size is not part of the fingerprint. What must agree is pairwise: what rank i sends to rank
j equals what rank j expects from rank i. A call's ``detail`` holds ``["splits", send numels, recv
numels]`` by group rank (:func:`repro.collectives.record.ops.split_numels`); :func:`split_mismatch`
compares one all-to-all's calls, live or from the records.

**Records that end without an answer**: when the ranks' sequences align, the job can still have
gone wrong: a rank that died before its first traced call leaves no file while its peers' calls
name it, and a job stopped as hung leaves calls (or waits) that never returned - a point-to-point
deadlock, a collective whose peer is stuck in a call the tracer cannot see. Either is a finding,
never "no divergence" (:func:`incomplete`).

**Tensors NCCL refuses**: a record names the parameters that held a non-contiguous tensor
(``CallRecord.strided``). gloo takes such a tensor; NCCL raises "Tensors must be contiguous" in the
same call, so a job that is clean on CPU ranks fails on GPUs. :func:`strided_notes` lists them once
per (rank, op, site, parameter): not a divergence, a note beside the report. (Found so: Ulysses'
positions passed DeepSpeed's all-gather a strided slice, clean on gloo, refused on 2 H100s.)
"""

from __future__ import annotations

import os
import pathlib

from repro.collectives.analyze.align import Divergence, first_divergence, parted
from repro.collectives.analyze.formats import read_dump_dir
from repro.collectives.analyze.report import divergence_from_json
from repro.collectives.events import (
    SIZE_FREE_OPS,
    CallRecord,
    RankTrace,
    channel,
    is_any_source,
    item_record,
    read_trace_dir,
)

# -- a trace directory ---------------------------------------------------------------------


def load_traces(directory: str | os.PathLike) -> dict[int, RankTrace]:
    """Per-rank traces from ``rank*.jsonl`` files, or else from Flight Recorder dumps."""
    path = pathlib.Path(directory)
    if not path.is_dir():
        raise ValueError(f"trace directory {str(path)!r} does not exist")
    traces = read_trace_dir(path)
    if not traces:
        traces = read_dump_dir(path)
    if not traces:
        raise ValueError(f"{path}: no rank*.jsonl trace files and no Flight Recorder dumps found")
    return traces


def analyze(directory: str | os.PathLike) -> tuple[dict[int, RankTrace], Divergence | None]:
    """The traces of a directory and their first divergence.

    A failure the live check recorded wins (it saw both ranks' calls before they ran);
    otherwise the per-rank sequences are aligned; when they agree, a rank without a record or a
    call that never returned is the finding (:func:`incomplete`).
    """
    traces = load_traces(directory)
    for t in sorted(traces.values(), key=lambda t: t.rank):
        if t.check_failures:
            return traces, divergence_from_json(t.check_failures[0]["report"])
    checks = (first_divergence, p2p_mismatch, unreceived, trace_split_mismatch)
    found = [d for d in (check(traces) for check in checks) if d]
    if found:
        div = min(found, key=lambda d: d.call_a.t if d.call_a else float("inf"))
        if div.kind == "stopped":
            # seen from the group, a rank stuck in a send that nobody receives merely stops
            div = next((d for d in found if d.kind == "unreceived" and d.rank_a == div.rank_b), div)
        div.parted = div.parted or parted(traces, div)
        return traces, div
    below = _below_python(pathlib.Path(directory), traces)
    return traces, below or incomplete(traces)


def _below_python(directory: pathlib.Path, traces: dict[int, RankTrace]) -> Divergence | None:
    """Flight Recorder dumps beside our records: a divergence in what ran below the Python API."""
    if traces and next(iter(traces.values())).meta.get("format") == "flight_recorder":
        return None  # the records are the dumps themselves
    dumps = read_dump_dir(directory)
    div = first_divergence(dumps) if len(dumps) >= 2 else None
    if div is not None:
        div.source = (
            "Flight Recorder (collectives run below the Python API: DDP, FSDP2, ProcessGroup methods)"
        )
    return div


# -- point-to-point pairing -----------------------------------------------------------------


def pair_differing_fields(x: CallRecord, y: CallRecord) -> list[str]:
    """The fields (numel, dtype) in which a send and its receive differ."""
    if x.op in SIZE_FREE_OPS or y.op in SIZE_FREE_OPS:
        return []
    return [f for f in ("numel", "dtype") if getattr(x, f) != getattr(y, f)]


def _ordered(x: CallRecord, y: CallRecord) -> tuple[CallRecord, CallRecord]:
    return (x, y) if x.rank < y.rank else (y, x)


def pair_divergence(x: CallRecord, y: CallRecord, kind: str, source: str) -> Divergence:
    a, b = _ordered(x, y)
    differing = pair_differing_fields(a, b) if kind == "mismatch" else []
    return Divergence(kind, a.group, a.ranks, a.rank, b.rank, a, b, differing=differing, source=source)


def p2p_mismatch(traces: dict[int, RankTrace]) -> Divergence | None:
    """Record mode: the earliest send/receive pair whose sizes or dtypes differ."""
    sides = _channel_ops(traces)
    found = []
    for (role, src, dst, seq), mine in sides.items():
        theirs = sides.get(("recv", src, dst, seq)) if role == "send" else None
        if theirs is not None and pair_differing_fields(mine, theirs):
            found.append(pair_divergence(mine, theirs, "mismatch", "trace: point-to-point pairing"))
    return min(found, key=lambda d: d.call_a.t) if found else None


def _channel_ops(traces: dict[int, RankTrace]) -> dict[tuple, CallRecord]:
    """(role, source, destination, seq) -> the op's record, for every numbered op of the records."""
    sides: dict[tuple, CallRecord] = {}
    for r, t in traces.items():
        for c in t.calls:
            for item in c.pairs:
                if item[1] is not None and item[2] is not None:
                    sides[(item[0], *channel(item[0], r, item[1]), item[2])] = item_record(c, item)
    return sides


def unreceived(traces: dict[int, RankTrace]) -> Divergence | None:
    """Record mode: the earliest send that no receive of its channel took (an extra send, a wrong peer).

    ``call_b`` is the call the receiver waits in instead (none when its record ends),
    ``last_b`` its last receive on the channel. A receiver with a receive from any source whose
    sender is not known (still waiting, or an ``irecv`` never waited for) may have taken the send,
    or may yet: not a finding. A send merely in flight when the job stopped
    for another reason is later than that reason, and the earliest finding wins.
    """
    sides = _channel_ops(traces)
    found = []
    for (role, src, dst, seq), send in sides.items():
        if role != "send" or ("recv", src, dst, seq) in sides or dst not in traces or dst == src:
            continue
        receiver = traces[dst]
        if any(is_any_source(i) for c in receiver.calls for i in c.pairs):
            continue  # an any-source receive of unknown sender (waiting, never waited) may be its
        took = [c for (r, s, d, _), c in sides.items() if r == "recv" and (s, d) == (src, dst)]
        blocked = next((c for c in receiver.calls if c.t_end is None), None)
        found.append(
            Divergence(
                "unreceived",
                send.group,
                send.ranks,
                src,
                dst,
                send,
                call_b=blocked,
                last_b=max(took, key=lambda c: c.pairs[0][2]) if took else receiver.last_call,
                source="trace: point-to-point pairing",
            )
        )
    return min(found, key=lambda d: d.call_a.t) if found else None


# -- all-to-all split sizes -----------------------------------------------------------------


def split_mismatch(calls: dict[int, CallRecord], source: str) -> Divergence | None:
    """The first pair (i sends, j expects) that disagree among one all-to-all's calls, by global rank."""
    ranks = sorted(calls)
    for i in ranks:
        ci = calls[i]
        if len(ci.detail) != 3 or ci.detail[0] != "splits":
            continue
        for j in ranks:
            cj = calls[j]
            if j == i or len(cj.detail) != 3 or cj.op != ci.op:
                continue
            gi, gj = ci.ranks.index(i), cj.ranks.index(j)
            if gj >= len(ci.detail[1]) or gi >= len(cj.detail[2]):
                continue
            if ci.detail[1][gj] != cj.detail[2][gi]:
                a, b = (ci, cj) if i < j else (cj, ci)
                div = Divergence("mismatch", a.group, a.ranks, a.rank, b.rank, a, b, differing=["splits"])
                div.source = (
                    f"{source}: rank {i} sends {ci.detail[1][gj]} elements to rank {j}, "
                    f"which expects {cj.detail[2][gi]}"
                )
                return div
    return None


def trace_split_mismatch(traces: dict[int, RankTrace]) -> Divergence | None:
    """Record mode: the earliest all-to-all whose ranks' split sizes disagree."""
    by_call: dict[tuple[str, int], dict[int, CallRecord]] = {}
    for r, t in traces.items():
        for c in t.calls:
            if c.group_seq is not None and c.op in ("all_to_all", "all_to_all_single"):
                by_call.setdefault((c.group, c.group_seq), {})[r] = c
    for _key, calls in sorted(by_call.items(), key=lambda kv: min(c.t for c in kv[1].values())):
        div = split_mismatch(calls, "trace")
        if div is not None:
            return div
    return None


# -- records that end without an answer -----------------------------------------------------


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


def strided_notes(traces: dict[int, RankTrace]) -> list[str]:
    """One line per (rank, op, site, parameter) that held a non-contiguous tensor (module docstring)."""
    seen: dict[tuple, int] = {}
    for rank, trace in sorted(traces.items()):
        for c in trace.calls:
            for name in c.strided:
                key = (rank, c.op, c.site, name)
                seen[key] = seen.get(key, 0) + 1
    return [
        f"note: rank {rank}'s {op} at {site} got a non-contiguous `{name}` ({n} call{'s' if n > 1 else ''}): "
        'gloo takes it, NCCL raises "Tensors must be contiguous"; pass .contiguous()'
        for (rank, op, site, name), n in seen.items()
    ]
