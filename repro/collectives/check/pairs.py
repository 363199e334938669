"""The live pairing check: before a point-to-point op transfers, its counterpart must match.

Check mode publishes each ``pairs`` item of a call (see :mod:`repro.collectives.events`) under
``<session>/p2p/<S>-<D>/<seq>/<role>`` and, before a blocking op (or an async op's ``wait``)
transfers, waits for the counterpart's key and compares numel and dtype: a mismatch raises on
both ranks with both call sites. While it waits it reads the peer's published blocking call: a
peer blocked on an op of this rank that this rank has not posted (the recv-recv and send-send
cycles, or a p2p against a collective) is a certain deadlock, reported at once.

A receive from any source (``recv``/``irecv`` with ``src=None``) names no channel until it
completes: the recorder then numbers it on the sender's channel
(:func:`repro.collectives.record.patches.learn_source`), publishes it and compares it with the
send it received. A blocking any-source receive publishes itself as the call its rank is blocked
in; a sender that finds its receiver there stops waiting for a counterpart key that only the
transfer can produce (the receiver compares the pair afterwards).
"""

from __future__ import annotations

import json
import time
from typing import Any

from repro.collectives.analyze.findings import pair_differing_fields, pair_divergence
from repro.collectives.events import CallRecord, channel, is_any_source, item_record

_OTHER = {"send": "recv", "recv": "send"}


def blocked_on(theirs: CallRecord, me: int, posted: Any, group_seq: Any) -> bool:
    """Whether a peer's blocking call waits for an op of rank ``me`` that ``me`` has not issued.

    ``posted``: this rank's numbering of its ops (``posted(role, src, dst)``, the tracer's
    ``pairs``); ``group_seq(group)``: how many collectives it issued on a group.
    """
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
        if block and any(is_any_source(i) for i in rec.pairs):
            # what senders look for before they give up waiting for this receive's key
            store.set(self.checker.last_key(rec.rank), json.dumps(rec.to_json(), separators=(",", ":")))
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
            if pair_differing_fields(mine, theirs):
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
                for key, item in missing.items():
                    if self._look_at_peer(rec, item, tracer):
                        todo.pop(key)  # left to the receiver to compare, once it knows the sender
                if not any(k in todo for k in missing):
                    return
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def _look_at_peer(self, rec: CallRecord, item: list[Any], tracer: Any) -> bool:
        """Raise on a certain deadlock; True when the peer waits in a receive from any source."""
        theirs = self.checker.peer_last(item[1])
        if theirs is None:
            return False
        if theirs.group_seq is None and any(is_any_source(p) for p in theirs.pairs):
            # Its key for this transfer appears only once the transfer ran. The peer may have gone
            # on since (the key shows its last blocking call): then gloo/NCCL wait as untraced.
            return item[0] == "send" and rec.rank in theirs.ranks
        if blocked_on(theirs, rec.rank, tracer.pairs, tracer.group_seq):
            mine = item_record(rec, item)
            source = f"check ({self.checker.mode.text}) on rank {rec.rank}: crossed waits, a certain deadlock"
            self.checker.fail(pair_divergence(mine, theirs, "deadlock", source), tracer)
        return False

