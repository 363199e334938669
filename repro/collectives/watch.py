"""Hang watch: when has a traced job stopped making progress?

Every traced call appends to its rank's record before it runs and again when it returns, so a
record that stops growing means a rank that stopped issuing and finishing calls. The job is
called hung when, for ``stall_s`` seconds, no live rank's record grew *and* some live rank has a
traced call (or wait) that never returned, or some rank has already exited (the live ones then
wait for it, maybe in a collective run below the Python API): ranks that merely compute for a
long time between collectives have nothing outstanding and are left alone.

A rank whose script has returned writes an ``end`` event; it is not waiting for anyone, however
long its interpreter takes to tear down. Ranks started by ``repro.collectives_trace run`` dump their Python stacks to stderr (their log)
on :data:`STACK_SIGNAL`, through :func:`faulthandler.register`.
"""

from __future__ import annotations

import pathlib
import signal
import time

from repro.collectives.events import read_trace_file

STACK_SIGNAL = signal.SIGUSR1
_POLL_S = 0.5


def register_stack_dump() -> None:
    """Make this process print every thread's Python stack to stderr on :data:`STACK_SIGNAL`."""
    import faulthandler

    faulthandler.register(STACK_SIGNAL, all_threads=True, chain=False)


class ProgressWatch:
    """Tracks the growth of ``rank*.jsonl`` in a trace directory."""

    def __init__(self, out_dir: pathlib.Path, stall_s: float) -> None:
        self.out_dir = out_dir
        self.stall_s = stall_s
        self._sizes: dict[int, int] = {}
        self._last_change = time.monotonic()
        self._next_poll = 0.0

    def idle_s(self) -> float:
        """Seconds since any rank's record last grew."""
        return time.monotonic() - self._last_change

    def _poll(self, live: list[int]) -> None:
        for rank in live:
            path = self.out_dir / f"rank{rank}.jsonl"
            size = path.stat().st_size if path.exists() else 0
            if self._sizes.get(rank) != size:
                self._sizes[rank] = size
                self._last_change = time.monotonic()

    def outstanding(self, live: list[int]) -> bool:
        """Whether a live rank's record ends in a call that never returned."""
        for rank in live:
            path = self.out_dir / f"rank{rank}.jsonl"
            if path.exists() and any(c.t_end is None for c in read_trace_file(path).calls):
                return True
        return False

    def stalled(self, live: list[int], finished: bool = False) -> bool:
        """Poll (at most every 0.5 s); True once the job counts as hung (never when ``stall_s`` is 0).

        ``finished``: some rank already exited. Live ranks that then make no progress wait for
        it, even when what they wait in runs below the Python API (DDP's reducer, FSDP2).
        """
        now = time.monotonic()
        if self.stall_s <= 0 or not live or now < self._next_poll:
            return False
        self._next_poll = now + _POLL_S
        self._poll(live)
        if self.idle_s() < self.stall_s:
            return False
        waiting = [r for r in live if not self._ended(r)]  # not those tearing down after the script
        return bool(waiting) and (finished or self.outstanding(waiting))

    def _ended(self, rank: int) -> bool:
        path = self.out_dir / f"rank{rank}.jsonl"
        if not path.exists():
            return False
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 64))
            return b'"ev":"end"' in f.read()
