"""Returns of async calls a library issued from C++ (DDP's buckets): written once seen complete.

A Python callback on the work's future would run on the backend's worker thread, which must then
take the GIL from the training thread: the worker stalls before it starts the next bucket. In the
profile of a traced DDP step on 2 gloo ranks this handoff cost more than everything else the
tracer does per call (a 1-element all_reduce from the dispatcher: 228 us traced with the callback,
95 us without, 12 us untraced). Instead the tracer keeps the posted works and asks each whether it
completed (a C++ call that needs no other thread) at its next traced call, and a daemon thread asks
every :data:`POLL_S` seconds, so that a rank that goes quiet after its last bucket does not look
stuck in it to the hang watch (:mod:`repro.collectives.watch`, which waits seconds, not
milliseconds). A ``ret`` thus carries the time it was seen, at most :data:`POLL_S` late.
"""

from __future__ import annotations

import threading
import time
from typing import Any

POLL_S = 0.2


class PendingReturns:
    """Posted async works of one tracer whose ``ret`` is not written yet."""

    def __init__(self, tracer: Any) -> None:
        self._tracer = tracer
        self._works: list[tuple[int, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, index: int, work: Any) -> None:
        """Call with the tracer's lock held."""
        self._works.append((index, work))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="repro-collectives-returns", daemon=True)
            self._thread.start()

    def flush(self) -> None:
        """Write the ``ret`` of every work that completed since the last look (the tracer's lock held)."""
        if not self._works:
            return
        waiting, done = [], []
        for item in self._works:
            try:
                finished = item[1].is_completed()
            except Exception:  # a work that cannot say counts as returned, as a backend without futures did
                finished = True
            (done if finished else waiting).append(item)
        if done:
            self._works = waiting
            t = repr(time.time())
            self._tracer.write_lines([f'{{"ev":"ret","index":{index},"t":{t}}}' for index, _ in done])

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            with self._tracer._lock:
                if self._tracer._writer is not None:
                    self.flush()

    def settle(self, timeout_s: float = 0.5) -> None:
        """Write the returns of the works still pending, waiting up to ``timeout_s`` for them.

        For the end of a traced script: a library may go on once a work's future is done while
        the work itself reports completion a moment later, and the poller would not see it before
        the process exits (a ``ret`` missing from a clean run reads as a call that never returned).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            with self._tracer._lock:
                if self._tracer._writer is not None:
                    self.flush()
                if not self._works:
                    return
            if time.monotonic() >= deadline:
                return
            time.sleep(0.001)

    def close(self) -> None:
        """Stop the poller and write the returns of what completes within half a second (lock not held)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * POLL_S)
        self.settle()
