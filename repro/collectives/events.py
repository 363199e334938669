"""The record model: one collective or point-to-point call, its fingerprint, and per-rank trace files.

A trace directory holds one append-only JSON-lines file per rank, ``rank{R}.jsonl``. Lines are
events: ``meta`` (once, first), ``group`` (a process group the first time it is used: key and
global ranks), ``call`` (written and flushed *before* the real call, so a rank that then aborts,
is killed or hangs still leaves it behind), ``ret`` (the call returned; for an async call a
library issued from C++, when its work completed), ``err`` (it raised:
not returned), ``source`` (a receive from any source completed: the sender's rank and the
transfer's number on that channel) and ``check_fail`` (the live check raised; carries the report
as JSON). The wait of an async op is a ``call`` of op ``wait`` (``of``: the index of the op it
waits for).

A point-to-point call carries its ops as ``pairs`` items ``[role, peer, seq, numel, dtype, op]``:
every send-side op from rank S to rank D is numbered on the channel S->D, every receive-side op
of D from S on the same channel, and the n-th send and the n-th receive of a channel are one
transfer, as both backends pair them in posting order (tags aside) (:func:`channel`,
:func:`item_record`; the numbering is
:class:`repro.collectives.record.tracer.PairCounter`, the live pairing check
:mod:`repro.collectives.check.pairs`, the pairing in the records
:mod:`repro.collectives.analyze.findings`).

The base of the trace tool, with :mod:`repro.collectives.callsite`: imports nothing of repro.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
from dataclasses import dataclass, field
from typing import Any

TRACE_GLOB = "rank*.jsonl"
_RANK_FILE = re.compile(r"rank(\d+)\.jsonl$")

# Ops whose per-rank element counts may legitimately differ (uneven splits, pickled objects).
SIZE_FREE_OPS = frozenset(
    {
        "all_to_all",
        "all_gather_object",
        "gather_object",
        "scatter_object_list",
        "broadcast_object_list",
        "send_object_list",
        "recv_object_list",
        "barrier",
        "monitored_barrier",
    }
)
P2P_OPS = frozenset(
    {"send", "recv", "isend", "irecv", "batch_isend_irecv", "send_object_list", "recv_object_list"}
)


@dataclass
class CallRecord:
    """One traced call on one rank.

    ``group_seq`` counts collectives per process group on this rank (1-based); p2p calls have
    none (they pair with one peer, not the group). ``root`` and ``peer`` are global ranks.
    """

    rank: int
    index: int
    op: str
    group: str
    ranks: tuple[int, ...]
    group_seq: int | None
    numel: int
    dtype: str
    site: str
    lib_site: str | None = None
    t: float = 0.0
    t_end: float | None = None
    root: int | None = None
    peer: int | None = None
    redop: str | None = None
    async_op: bool = False
    size_free: bool = False
    detail: list[Any] = field(default_factory=list)
    pairs: list[Any] = field(default_factory=list)
    """Point-to-point ops: ``[role, peer, seq, numel, dtype, op]`` each (see the module docstring)."""
    stack: list[str] = field(default_factory=list)
    """The user's frames outward from ``site`` (callers, down to the loop), innermost first."""
    of: int | None = None
    """For a ``wait``: the index of the async call it waits for."""
    issuer: str | None = None
    """For a call a library issued from C++ (no Python collective function ran): which mechanism
    and the settings that shape it, e.g. DDP's unused-parameter bitmap (see :mod:`repro.collectives.record.native`)."""
    strided: list[str] = field(default_factory=list)
    """The call's parameters that held a non-contiguous tensor: gloo takes one, NCCL raises
    "Tensors must be contiguous" (see :func:`repro.collectives.analyze.findings.strided_notes`)."""

    @property
    def is_p2p(self) -> bool:
        return self.op in P2P_OPS

    def fingerprint(self) -> tuple:
        """What every rank of the group must agree on for the call to be the same collective."""
        numel = None if (self.size_free or self.op in SIZE_FREE_OPS) else self.numel
        dtype = None if self.op in SIZE_FREE_OPS else self.dtype
        return (self.op, numel, dtype, self.root, self.redop, self.group)

    def differing_fields(self, other: CallRecord) -> list[str]:
        """Names of the fingerprint fields in which two calls differ, in reporting order."""
        names = ("op", "numel", "dtype", "root", "redop", "group")
        return [n for n, a, b in zip(names, self.fingerprint(), other.fingerprint(), strict=False) if a != b]

    def short(self) -> str:
        """``all_reduce numel=1 float32`` plus root/redop when set."""
        op = self.op
        if op == "wait" and len(self.detail) == 3 and self.detail[0] == "for":
            op = f"wait for {self.detail[1]}" + (f" #{self.detail[2]}" if self.detail[2] is not None else "")
        parts = [op, f"numel={self.numel}", self.dtype]
        if self.redop:
            parts.append(f"op={self.redop}")
        if self.root is not None:
            parts.append(f"root={self.root}")
        if self.peer is not None:
            parts.append(f"peer={self.peer}")
        return " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        # Hand-written rather than dataclasses.asdict: this runs on every traced call and asdict
        # deep-copies field by field (about 10x slower).
        return {
            "rank": self.rank,
            "index": self.index,
            "op": self.op,
            "group": self.group,
            "ranks": list(self.ranks),
            "group_seq": self.group_seq,
            "numel": self.numel,
            "dtype": self.dtype,
            "site": self.site,
            "lib_site": self.lib_site,
            "t": self.t,
            "t_end": self.t_end,
            "root": self.root,
            "peer": self.peer,
            "redop": self.redop,
            "async_op": self.async_op,
            "size_free": self.size_free,
            "detail": list(self.detail),
            "pairs": list(self.pairs),
            "stack": list(self.stack),
            "of": self.of,
            "issuer": self.issuer,
            "strided": list(self.strided),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CallRecord:
        d = dict(d)
        d["ranks"] = tuple(d.get("ranks", ()))
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class RankTrace:
    """Everything one rank's file says: its calls in issue order, groups, and any check failure."""

    rank: int
    calls: list[CallRecord] = field(default_factory=list)
    groups: dict[str, tuple[int, ...]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    check_failures: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""

    @property
    def last_call(self) -> CallRecord | None:
        return self.calls[-1] if self.calls else None

    def collectives(self, group: str) -> list[CallRecord]:
        return [c for c in self.calls if c.group == group and c.group_seq is not None]


def channel(role: str, me: int, peer: int) -> tuple[int, int]:
    """(source, destination) of a transfer."""
    return (me, peer) if role == "send" else (peer, me)


def is_any_source(item: list[Any]) -> bool:
    """A ``pairs`` item of a receive from any source whose sender is not known yet."""
    return item[0] == "recv" and item[1] is None


def item_record(rec: CallRecord, item: list[Any]) -> CallRecord:
    """The record of one op of a call (a batch holds several), for pairing and reports."""
    role, peer, _seq, numel, dtype, op = item
    return dataclasses.replace(rec, op=op, numel=numel, dtype=dtype, peer=peer, pairs=[item], detail=[])


class TraceFileWriter:
    """Append-only JSON-lines writer; every event is one ``write(2)`` so it survives kill -9."""

    def __init__(self, path: pathlib.Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, event: dict[str, Any]) -> None:
        # os.write on an O_APPEND fd goes straight to the kernel: nothing buffered in-process.
        os.write(self._fd, (json.dumps(event, separators=(",", ":")) + "\n").encode())

    def write_line(self, line: str) -> None:
        """One event already formatted as a JSON object."""
        os.write(self._fd, (line + "\n").encode())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_trace_file(path: pathlib.Path) -> RankTrace:
    """Parse one ``rank{R}.jsonl``; a torn last line (process killed mid-write) is ignored."""
    m = _RANK_FILE.search(path.name)
    if not m:
        raise ValueError(f"{path}: not a trace file (expected a name like rank0.jsonl)")
    trace = RankTrace(rank=int(m.group(1)), source=str(path))
    by_index: dict[int, CallRecord] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = ev.pop("ev", None)
            if kind == "call":
                rec = CallRecord.from_json(ev)
                trace.calls.append(rec)
                by_index[rec.index] = rec
            elif kind == "ret":
                rec = by_index.get(ev.get("index"))
                if rec is not None:
                    rec.t_end = ev.get("t")
            elif kind == "source":
                rec = by_index.get(ev.get("index"))
                if rec is not None and rec.pairs:
                    rec.peer = ev["peer"]
                    rec.pairs[0] = ["recv", ev["peer"], ev["seq"], *rec.pairs[0][3:]]
            elif kind == "group":
                trace.groups[ev["group"]] = tuple(ev["ranks"])
            elif kind == "meta":
                trace.meta = ev
            elif kind == "check_fail":
                trace.check_failures.append(ev)
    return trace


def read_trace_dir(directory: pathlib.Path) -> dict[int, RankTrace]:
    """All ``rank*.jsonl`` files of a directory, by rank."""
    traces = {}
    for path in sorted(directory.glob(TRACE_GLOB)):
        t = read_trace_file(path)
        traces[t.rank] = t
    return traces
