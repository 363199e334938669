"""Point-to-point pairing: per-pair sequence numbers, the live pairing check, and record-mode pairing.

Every send-side op (``send``, ``isend``, a send in ``batch_isend_irecv``, ``send_object_list``)
from rank S to rank D is numbered on the channel S->D; every receive-side op of D from S is
numbered on the same channel. The n-th send and the n-th receive of a channel are one transfer,
as both backends pair them in posting order (tags aside). A call record carries its ops as
``pairs`` items ``[role, peer, seq, numel, dtype, op]``.

Check mode publishes each item under ``<session>/p2p/<S>-<D>/<seq>/<role>`` and, before a
blocking op (or an async op's ``wait``) transfers, waits for the counterpart's key and compares
numel and dtype: a mismatch raises on both ranks with both call sites. While it waits it reads
the peer's published blocking call: a peer blocked on an op of this rank that this rank has not
posted (the recv-recv and send-send cycles, or a p2p against a collective) is a certain deadlock,
reported at once. A receive from any source (``src=None``) cannot be paired and is not checked.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

from repro.collectives.align import Divergence
from repro.collectives.events import SIZE_FREE_OPS, CallRecord, RankTrace

ROLE = {
    "send": "send",
    "isend": "send",
    "send_object_list": "send",
    "recv": "recv",
    "irecv": "recv",
    "recv_object_list": "recv",
}
BLOCKING = frozenset({"send", "recv", "send_object_list", "recv_object_list", "batch_isend_irecv"})
_OTHER = {"send": "recv", "recv": "send"}


def channel(role: str, me: int, peer: int) -> tuple[int, int]:
    """(source, destination) of a transfer."""
    return (me, peer) if role == "send" else (peer, me)


class PairCounter:
    """Per-channel numbering of one rank's point-to-point ops."""

    def __init__(self) -> None:
        self._posted: dict[tuple[str, int, int], int] = {}

    def number(self, role: str, me: int, peer: int | None) -> int | None:
        if peer is None:
            return None
        key = (role, *channel(role, me, peer))
        self._posted[key] = n = self._posted.get(key, 0) + 1
        return n

    def posted(self, role: str, src: int, dst: int) -> int:
        return self._posted.get((role, src, dst), 0)


def item_record(rec: CallRecord, item: list[Any]) -> CallRecord:
    """The record of one op of a call (a batch holds several), for pairing and reports."""
    role, peer, _seq, numel, dtype, op = item
    return dataclasses.replace(rec, op=op, numel=numel, dtype=dtype, peer=peer, pairs=[item], detail=[])


def _mismatch(x: CallRecord, y: CallRecord) -> list[str]:
    if x.op in SIZE_FREE_OPS or y.op in SIZE_FREE_OPS:
        return []
    return [f for f in ("numel", "dtype") if getattr(x, f) != getattr(y, f)]


def _ordered(x: CallRecord, y: CallRecord) -> tuple[CallRecord, CallRecord]:
    return (x, y) if x.rank < y.rank else (y, x)


def pair_divergence(x: CallRecord, y: CallRecord, kind: str, source: str) -> Divergence:
    a, b = _ordered(x, y)
    differing = _mismatch(a, b) if kind == "mismatch" else []
    return Divergence(kind, a.group, a.ranks, a.rank, b.rank, a, b, differing=differing, source=source)


def blocked_on(theirs: CallRecord, me: int, posted: PairCounter, group_seq: Any) -> bool:
    """Whether a peer's blocking call waits for an op of rank ``me`` that ``me`` has not issued."""
    if theirs.group_seq is not None:
        return me in theirs.ranks and group_seq(theirs.group) < theirs.group_seq
    for role, peer, seq, *_ in theirs.pairs:
        if peer != me or seq is None:
            continue
        src, dst = channel(role, theirs.rank, me)
        if posted.posted(_OTHER[role], src, dst) < seq:
            return True
    return False


class PairChecker:
    """The live pairing check of one tracing session (uses the session's store and timeout)."""

    def __init__(self, checker: Any) -> None:
        self.checker = checker
        self._verified: set[str] = set()

    def _key(self, role: str, src: int, dst: int, seq: int) -> str:
        return f"{self.checker.prefix}/p2p/{src}-{dst}/{seq}/{role}"

    def _items(self, rec: CallRecord) -> list[list[Any]]:
        return [i for i in rec.pairs if i[1] is not None and i[2] is not None and i[1] != rec.rank]

    def publish(self, rec: CallRecord) -> None:
        items = self._items(rec)
        if items:
            keys = [self._key(i[0], *channel(i[0], rec.rank, i[1]), i[2]) for i in items]
            payloads = [json.dumps(item_record(rec, i).to_json(), separators=(",", ":")) for i in items]
            self.checker.store().multi_set(keys, payloads)

    def verify(self, rec: CallRecord, tracer: Any, block: bool) -> None:
        """Compare this call's ops with their counterparts (waiting for them when ``block``)."""
        store = self.checker.store()
        todo = {}
        for i in self._items(rec):
            key = self._key(_OTHER[i[0]], *channel(i[0], rec.rank, i[1]), i[2])
            if key not in self._verified:
                todo[key] = i
        if not todo:
            return
        if block:
            store.set(self.checker.last_key(rec.rank), json.dumps(rec.to_json(), separators=(",", ":")))
            self._wait(rec, todo, tracer)
        for key, item in todo.items():
            if not store.check([key]):
                continue  # non-blocking look: the counterpart is not posted yet; the wait checks it
            mine = item_record(rec, item)
            theirs = CallRecord.from_json(json.loads(store.get(key)))
            store.delete_key(key)
            self._verified.add(key)
            if _mismatch(mine, theirs):
                source = f"check ({self.checker.mode.text}) on rank {rec.rank}: point-to-point pairing"
                self.checker.fail(pair_divergence(mine, theirs, "mismatch", source), tracer)

    def _wait(self, rec: CallRecord, todo: dict[str, list[Any]], tracer: Any) -> None:
        store = self.checker.store()
        start = time.monotonic()
        pause, next_look = 5e-5, start + 0.1
        while True:
            missing = {k: i for k, i in todo.items() if not store.check([k])}
            if not missing:
                return
            now = time.monotonic()
            if now - start > self.checker.timeout_s:
                item = next(iter(missing.values()))
                self.checker.fail(self.checker.timeout_divergence(item_record(rec, item), [item[1]]), tracer)
            if now >= next_look:
                next_look = now + 0.1
                for item in missing.values():
                    self._look_at_peer(rec, item, tracer)
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def _look_at_peer(self, rec: CallRecord, item: list[Any], tracer: Any) -> None:
        theirs = self.checker.peer_last(item[1])
        if theirs is None:
            return
        if theirs.group_seq is None and any(p[1] is None and p[0] == "recv" for p in theirs.pairs):
            return  # the peer receives from any source: not pairable, and not a deadlock we can prove
        if blocked_on(theirs, rec.rank, tracer.pairs, tracer.group_seq):
            mine = item_record(rec, item)
            source = f"check ({self.checker.mode.text}) on rank {rec.rank}: crossed waits, a certain deadlock"
            self.checker.fail(pair_divergence(mine, theirs, "deadlock", source), tracer)


def p2p_mismatch(traces: dict[int, RankTrace]) -> Divergence | None:
    """Record mode: the earliest send/receive pair whose sizes or dtypes differ."""
    sides: dict[tuple, CallRecord] = {}
    for r, t in traces.items():
        for c in t.calls:
            for item in c.pairs:
                if item[1] is not None and item[2] is not None:
                    sides[(item[0], *channel(item[0], r, item[1]), item[2])] = item_record(c, item)
    found = []
    for (role, src, dst, seq), mine in sides.items():
        theirs = sides.get(("recv", src, dst, seq)) if role == "send" else None
        if theirs is not None and _mismatch(mine, theirs):
            found.append(pair_divergence(mine, theirs, "mismatch", "trace: point-to-point pairing"))
    return min(found, key=lambda d: d.call_a.t) if found else None
