"""Python's garbage collections during a timed call: how many, of which generation, and how long the host stood still.

Why a bench measures them: a collection stops the host's Python thread, and a host that stops issuing work leaves the
GPU idle once its queue drains. The youngest generation is scanned every few hundred container objects; the oldest
(generation 2) scans every object the process still holds, and with torch.compile's graphs, guards and caches in memory
that is millions of objects. A library that makes many short-lived containers per call (FlashAttention-4's Python
interface builds tuples and closures on every call) triggers young collections more often and, through them, full
ones. Session 26's profiled FA4 update left the GPU idle 3x longer than FA2's, spread over phases that do not call
attention at all; session 27 measured this cause without a profiler and ruled it out at the 0.6B form C update: no full
collection in 180 timed updates, at most 2 ms of collections in one (``results/actor_update/README.md``).

:class:`GcPauses` counts the collections that ``gc.callbacks`` reports while it is active; :func:`apply` sets a policy
for the bench's timed calls (``--gc``): ``default`` (Python's own), ``freeze`` (``gc.freeze()`` after the warm-up: the
objects alive then, the compiled graphs among them, move to a generation no collection scans; new garbage is collected
as before).
"""

from __future__ import annotations

import gc
import time
from typing import Any

POLICIES = ("default", "freeze")


class GcPauses:
    """Collections while active (a context manager): ``count[g]`` and ``seconds[g]`` per generation ``g``."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._start = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            generation = int(info["generation"])
            self.count[generation] += 1
            self.seconds[generation] += time.perf_counter() - self._start

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def total_seconds(self) -> float:
        return sum(self.seconds)


def apply(policy: str) -> None:
    """Set ``policy`` (one of :data:`POLICIES`) for what runs after the call (the bench: after its warm-up)."""
    if policy not in POLICIES:
        raise ValueError(f"--gc={policy!r} is not valid; choose one of {list(POLICIES)}")
    if policy == "freeze":
        gc.collect()  # what is garbage now is not frozen with the rest
        gc.freeze()
