"""Errors of the ranks, as the user should see them: which rank, on which host, saying what.

``ray.get`` on a failed rank call raises a ``RayTaskError`` whose text is two nested tracebacks
and whose rank is nowhere; a rank that died (killed, out of memory, segfault) gives an
``ActorDiedError`` naming an actor id. :func:`gather` waits for the calls of all ranks in the
order they finish and turns the first failure into a :class:`WorkerError`: one line (rank, host,
method, the original exception type and message, or "died") with the full remote traceback kept
in ``.details`` for the run's log.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ray


class WorkerError(RuntimeError):
    """A rank failed or died; ``str()`` is one line, ``details`` the remote traceback."""

    def __init__(self, rank: int, host: str, method: str, summary: str, details: str, died: bool) -> None:
        self.rank, self.host, self.method, self.died, self.details = rank, host, method, died, details
        self.summary = summary
        super().__init__(f"rank {rank} on host {host} {'died' if died else 'failed'} in {method}: {summary}")

    def with_log(self, path: object) -> WorkerError:
        """The same error, its line ending with where the full traceback is."""
        return WorkerError(self.rank, self.host, self.method, f"{self.summary} (full log: {path})", self.details,
                           self.died)


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""


def to_worker_error(err: Exception, rank: int, host: str, method: str) -> WorkerError:
    """The :class:`WorkerError` for ``err`` raised by rank ``rank``'s call of ``method``."""
    if isinstance(err, ray.exceptions.RayTaskError):
        cause = err.cause
        if isinstance(cause, ray.exceptions.RayActorError):
            return to_worker_error(cause, rank, host, method)
        summary = f"{type(cause).__name__}: {_first_line(cause)}" if cause is not None else _first_line(err)
        return WorkerError(rank, host, method, summary, str(err), died=False)
    if isinstance(err, ray.exceptions.RayActorError):
        text = getattr(err, "error_msg", None) or str(err)
        # Ray's message for a dead actor starts with a generic sentence; keep the reason it gives.
        reason = next((ln.strip() for ln in str(text).splitlines() if "reason" in ln.lower() or "exit" in ln.lower()),
                      _first_line(text))
        return WorkerError(rank, host, method, f"the rank's process ended ({reason})", str(text), died=True)
    return WorkerError(rank, host, method, f"{type(err).__name__}: {_first_line(err)}", repr(err), died=False)


def gather(refs: Sequence[Any], method: str, hosts: Sequence[str]) -> list[Any]:
    """``ray.get(refs)`` (one ref per rank, in rank order), raising :class:`WorkerError` on the first
    rank to fail; peers blocked on the failed rank are not waited for."""
    index = {ref: rank for rank, ref in enumerate(refs)}
    results: dict[int, Any] = {}
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for ref in ready:
            rank = index[ref]
            try:
                results[rank] = ray.get(ref)
            except (ray.exceptions.RayError, Exception) as e:  # noqa: BLE001 - every rank failure is reported
                raise to_worker_error(e, rank, hosts[rank] if rank < len(hosts) else "?", method) from None
    return [results[r] for r in range(len(refs))]
