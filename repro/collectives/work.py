"""Async work: the ``Work`` of an ``async_op=True`` call (or ``isend``/``irecv``) with its waits traced.

``wait()`` and ``get_future().wait()`` are where an async call blocks, so each is recorded as a
call of op ``wait`` (``of``: the index of the async call) before it blocks and returns after it:
a rank stuck in a wait shows that wait, at the user's line, and which call it waits for. In
check mode the wait of an ``isend``/``irecv`` first verifies that the peer posted the matching op
(see :mod:`repro.collectives.p2p`). Everything else is delegated to the real object.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

from repro.collectives.active import active
from repro.collectives.callsite import sites_and_stack
from repro.collectives.events import CallRecord, is_any_source
from repro.collectives.p2p import learn_source


def traced_wait(
    rec: CallRecord, tracer: Any, real_wait: Any, args: tuple, kwargs: dict, work: Any = None
) -> Any:
    """``real_wait(*args, **kwargs)`` recorded as a ``wait`` of ``rec``; ``work``: the Work waited for."""
    if active() is not tracer:  # the trace ended before this wait
        return real_wait(*args, **kwargs)
    site, lib, stack = sites_and_stack(sys._getframe(1))
    with tracer._lock:
        tracer._index += 1
        wait = dataclasses.replace(
            rec,
            index=tracer._index,
            op="wait",
            group_seq=None,
            site=site,
            lib_site=lib,
            stack=stack,
            t=time.time(),
            t_end=None,
            of=rec.index,
            detail=["for", rec.op, rec.group_seq],
            pairs=[],  # the transfer is numbered once, on its call
        )
        event = wait.to_json()
        event["ev"] = "call"
        del event["t_end"]
        tracer.write_event(event)
    if tracer.checker is not None and rec.pairs:
        tracer.checker.check_p2p(rec, tracer, block=True, publish=False)
    try:
        result = real_wait(*args, **kwargs)
    except BaseException as exc:
        tracer.write_event({"ev": "err", "index": wait.index, "t": time.time(), "error": repr(exc)[:200]})
        raise
    tracer.write_event({"ev": "ret", "index": wait.index, "t": time.time()})
    if work is not None and rec.pairs and is_any_source(rec.pairs[0]):
        # irecv(src=None): its work knows the sender (a group rank) once it completed
        learn_source(tracer, rec, rec.ranks[work._source_rank()])
    return result


class TracedFuture:
    """A Work's future whose ``wait`` is traced."""

    def __init__(self, future: Any, rec: CallRecord, tracer: Any, work: Any) -> None:
        self._future, self._rec, self._tracer, self._work = future, rec, tracer, work

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        return traced_wait(self._rec, self._tracer, self._future.wait, args, kwargs, self._work)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._future, name)


class TracedWork:
    """A ``torch.distributed.Work`` whose ``wait`` (and future's ``wait``) is traced."""

    def __init__(self, work: Any, rec: CallRecord, tracer: Any) -> None:
        self._work, self._rec, self._tracer = work, rec, tracer

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        return traced_wait(self._rec, self._tracer, self._work.wait, args, kwargs, self._work)

    def get_future(self) -> TracedFuture:
        return TracedFuture(self._work.get_future(), self._rec, self._tracer, self._work)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)
