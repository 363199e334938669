"""Check mode: before a collective runs, the ranks of its group compare fingerprints through the store.

Each rank publishes its call (op, numel, dtype, root, reduce op, call sites, its group sequence
number) under a key named by the tracing session and the group, then reads its peers' keys. A
difference raises :class:`CollectiveMismatchError` on every rank of the group, before the real
call could abort (gloo) or hang (NCCL). A peer that does not publish within ``timeout_s`` is
reported with the last call it published (``.../last/<rank>``, written with every check).

Cost per checked call, when the peers are already there: one ``multi_set`` (the store does not
answer it) and one ``compare_set`` per peer, used as a read that does not block (its expected
value is never stored, so it writes nothing and returns what the key holds). A rank's key is one
of two slots per group, overwritten by its next checked call rather than deleted: a peer is at
most one checked call behind (it needs this rank's key to pass its own check), so the other slot
still holds what it reads, and the call number in each payload tells a stale slot from the current
one. While a rank waits, it also looks at its peers' last published calls: a peer blocked in a
call of another group that this rank has not issued yet is a certain deadlock and is reported at
once, without waiting for the timeout.
"""

from __future__ import annotations

import datetime
import json
import time
from dataclasses import dataclass
from typing import Any

from repro.collectives.analyze.align import Divergence
from repro.collectives.analyze.findings import pair_divergence, split_mismatch
from repro.collectives.analyze.report import divergence_to_json, format_divergence
from repro.collectives.check.pairs import PairChecker, blocked_on
from repro.collectives.events import CallRecord

CHECK_CHOICES = "off, every, sample:N (N >= 1)"
# compare_set's expected value: never a payload, so compare_set(key, _ABSENT, _ABSENT) stores nothing
# and returns the key's value, or _ABSENT when there is none.
_ABSENT = "\x00absent"
_ABSENT_BYTES = _ABSENT.encode()
SLOTS = 2


@dataclass(frozen=True)
class CheckMode:
    """``off`` (record only), ``every`` call, or every Nth call of each group (``sample:N``)."""

    every: int  # 0 = off

    @property
    def text(self) -> str:
        return "off" if self.every == 0 else "every" if self.every == 1 else f"sample:{self.every}"

    @classmethod
    def parse(cls, text: str, source: str = "check") -> CheckMode:
        value = (text or "off").strip().lower()
        if value in ("off", "none", "record", "0"):
            return cls(0)
        if value == "every":
            return cls(1)
        if value.startswith("sample:"):
            try:
                n = int(value.split(":", 1)[1])
            except ValueError:
                n = 0
            if n >= 1:
                return cls(n)
        raise ValueError(f"{source}={text!r} is not a check mode; valid: {CHECK_CHOICES}")

    def wants(self, group_seq: int) -> bool:
        return self.every > 0 and group_seq % self.every == 0


class CollectiveMismatchError(RuntimeError):
    """Ranks of a group are about to issue different collectives (or one never arrived).

    ``divergence`` holds the structured finding; ``report`` its text, also the message.
    """

    def __init__(self, divergence: Divergence) -> None:
        self.divergence = divergence
        self.report = format_divergence(divergence)
        super().__init__(self.report)


def _payload(rec: CallRecord) -> str:
    d = rec.to_json()
    if not d["detail"] or d["detail"][0] != "splits":  # all-to-all splits are compared across ranks
        d.pop("detail", None)
    return json.dumps(d, separators=(",", ":"))


class Checker:
    """Runs the store exchange for the calls its mode selects."""

    def __init__(self, mode: CheckMode, timeout_s: float, session: str) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.mode = mode
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.timeout_s = timeout_s
        self.prefix = f"repro_ct/{session}"
        self._store: Any = None
        self._parted: dict[str, dict] = {}  # group -> where the ranks' stacks first differed
        self.pairs = PairChecker(self)

    def store(self) -> Any:
        if self._store is None:
            # Imported here: the launcher and analyze/export import this module (CheckMode,
            # CollectiveMismatchError) without needing torch, ~3 CPU s per process on 2 cores.
            import torch.distributed as dist

            self._store = dist.distributed_c10d._get_default_store()
        return self._store

    def last_key(self, rank: int) -> str:
        """Where a rank publishes the call it is blocked in (read by peers to find deadlocks)."""
        return self._last_key(rank)

    def peer_last(self, rank: int) -> CallRecord | None:
        raw = self.read(self._last_key(rank))
        return None if raw is None else CallRecord.from_json(json.loads(raw))

    def read(self, key: str) -> bytes | None:
        """A key's value, or None when it is not set: one round trip that never blocks."""
        raw = self.store().compare_set(key, _ABSENT, _ABSENT)
        return None if raw == _ABSENT_BYTES else raw

    def check_p2p(self, rec: CallRecord, tracer: Any, block: bool, publish: bool = True) -> None:
        """Point-to-point ops: publish them, and verify their counterparts (waiting when ``block``).

        Every op is checked whatever the sampling: a p2p pair is not a group-wide sequence.
        ``publish=False`` for the wait of an async op, published when it was posted.
        """
        if publish:
            self.pairs.publish(rec)
        self.pairs.verify(rec, tracer, block)

    def _key(self, group: str, slot: int, rank: int) -> str:
        return f"{self.prefix}/{group}/{slot}/{rank}"

    def _last_key(self, rank: int) -> str:
        return f"{self.prefix}/last/{rank}"

    def check(self, rec: CallRecord, previous: list[CallRecord], tracer: Any) -> None:
        if rec.group_seq is None or not self.mode.wants(rec.group_seq) or len(rec.ranks) < 2:
            return
        store = self.store()
        mine = _payload(rec)
        slot = (rec.group_seq // self.mode.every) % SLOTS
        store.multi_set([self._key(rec.group, slot, rec.rank), self._last_key(rec.rank)], [mine, mine])
        keys = {r: self._key(rec.group, slot, r) for r in rec.ranks if r != rec.rank}
        calls = {rec.rank: rec}
        crossed = self._wait_for_peers(rec, keys, calls, tracer)
        if crossed is not None:
            crossed.before = [(c, None) for c in previous]
            self.fail(crossed, tracer)
        # Every rank compares the same pairs (lowest rank against each other one), so all raise
        # the same report.
        ordered = sorted(calls)
        ref = calls[ordered[0]]
        for r in ordered[1:]:
            other = calls[r]
            if other.fingerprint() != ref.fingerprint():
                div = Divergence(
                    kind="mismatch",
                    group=rec.group,
                    ranks=rec.ranks,
                    rank_a=ref.rank,
                    rank_b=other.rank,
                    call_a=ref,
                    call_b=other,
                    differing=ref.differing_fields(other),
                    before=[(c, None) for c in previous],
                    source=f"check ({self.mode.text}) on rank {rec.rank}",
                )
                self.fail(div, tracer)
            if other.stack != ref.stack and rec.group not in self._parted:
                self._parted[rec.group] = {
                    "seq": rec.group_seq,
                    "call": ref.short(),
                    "stacks": {ref.rank: ref.stack, other.rank: other.stack},
                }
        div = split_mismatch(calls, f"check ({self.mode.text}) on rank {rec.rank}")
        if div is not None:
            div.before = [(c, None) for c in previous]
            self.fail(div, tracer)

    def _collect(self, rec: CallRecord, keys: dict[int, str], calls: dict[int, CallRecord]) -> bool:
        """Read the peers' payloads for this call not read yet into ``calls``; True once all are in.

        A slot that still holds the peer's previous checked call (another sequence number) is
        read again on the next poll.
        """
        for r, key in keys.items():
            if r in calls:
                continue
            raw = self.read(key)
            if raw is None:
                continue
            theirs = CallRecord.from_json(json.loads(raw))
            if theirs.group_seq == rec.group_seq:
                calls[r] = theirs
        return len(calls) > len(keys)

    def _wait_for_peers(
        self, rec: CallRecord, keys: dict[int, str], calls: dict[int, CallRecord], tracer: Any
    ) -> Divergence | None:
        """Poll until every peer published this call; a deadlock or the timeout gives a divergence.

        Polling rather than a blocking ``wait``: while waiting, peers' last published calls are
        inspected, which finds crossed waits across groups in a fraction of a second (rank 0 in
        group A waiting for rank 1, rank 1 in group B waiting for rank 0); and a TCPStore ``wait``
        that times out leaves its connection unusable (seen with torch 2.13). The pause between
        polls stays short at first: a peer a few milliseconds late (ranks drift within a step)
        must not cost ten.
        """
        if self._collect(rec, keys, calls):
            return None
        start = time.monotonic()
        pause, next_look = 5e-5, start + 0.1
        while True:
            time.sleep(pause)
            now = time.monotonic()
            pause = min(pause * 2, 0.0005 if now - start < 0.2 else 0.01)
            if self._collect(rec, keys, calls):
                return None
            now = time.monotonic()
            missing = [r for r in keys if r not in calls]
            if now - start > self.timeout_s:
                return self.timeout_divergence(rec, missing)
            if now >= next_look:
                next_look = now + 0.1
                crossed = self._crossed_wait(rec, {r: keys[r] for r in missing}, calls, tracer)
                if crossed is not None:
                    return crossed

    def _crossed_wait(
        self, rec: CallRecord, missing: dict[int, str], calls: dict[int, CallRecord], tracer: Any
    ) -> Divergence | None:
        """A peer blocked in a checked call that this rank has not issued: neither can go on.

        The peer cannot have passed that call (it needs this rank's key for it), and this rank
        cannot reach it while it waits here, so the wait is a certain deadlock.
        """
        for r, key in missing.items():
            theirs = self.peer_last(r)
            if theirs is None or (theirs.group, theirs.group_seq) == (rec.group, rec.group_seq):
                continue
            # Its last call may be a later one because it published this call, read ours and went
            # on since this rank last polled: it published this one first, so the slot shows it now.
            self._collect(rec, {r: key}, calls)
            if r in calls:
                continue
            if theirs.group_seq is None:  # the peer is blocked in a point-to-point op
                if blocked_on(theirs, rec.rank, tracer.pairs, tracer.group_seq):
                    source = f"check ({self.mode.text}) on rank {rec.rank}: crossed waits, a certain deadlock"
                    return pair_divergence(rec, theirs, "deadlock", source)
                continue
            if rec.rank not in theirs.ranks:
                continue
            if tracer.group_seq(theirs.group) < theirs.group_seq:
                a, b = (rec, theirs) if rec.rank < r else (theirs, rec)
                return Divergence(
                    kind="mismatch",
                    group=a.group,
                    ranks=a.ranks,
                    rank_a=a.rank,
                    rank_b=b.rank,
                    call_a=a,
                    call_b=b,
                    differing=a.differing_fields(b),
                    source=f"check ({self.mode.text}) on rank {rec.rank}: crossed waits, a certain deadlock",
                )
        return None

    def timeout_divergence(self, rec: CallRecord, missing: list[int]) -> Divergence:
        """``missing`` peers did not arrive within the timeout; name the last call each published."""
        late = missing[0]
        return Divergence(
            kind="timeout",
            group=rec.group,
            ranks=rec.ranks,
            rank_a=rec.rank,
            rank_b=late,
            call_a=rec,
            call_b=None,
            last_b=self.peer_last(late),
            missing_ranks=missing,
            source=f"check ({self.mode.text}) on rank {rec.rank}, waited {self.timeout_s:g} s",
        )

    def fail(self, div: Divergence, tracer: Any) -> None:
        if div.parted is None:
            div.parted = self._parted.get(div.group)
        tracer.write_event({"ev": "check_fail", "report": divergence_to_json(div)})
        raise CollectiveMismatchError(div)
