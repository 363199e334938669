"""torch.distributed's Python functions wrapped: each call recorded (and checked) before it runs.

Each wrapped call writes a ``call`` event (and runs the live check, when on) before the real call
and a ``ret`` event after it returns. Wrappers are installed on ``torch.distributed`` and
``torch.distributed.distributed_c10d`` (torch's own helpers such as ``all_gather_object`` call
through the latter), and on DeepSpeed's backend object, which caches the all-gather and
reduce-scatter functions it found at start-up. Everything DeepSpeed's ``deepspeed.comm`` does
ends in these functions, so it is covered once, without double records. A call made while
another traced call is running on the same thread (the ``broadcast`` inside
``broadcast_object_list``) is not recorded again.

**Async work**: the ``Work`` of an ``async_op=True`` call (or ``isend``/``irecv``) comes back with
its waits traced. ``wait()`` and ``get_future().wait()`` are where an async call blocks, so each
is recorded as a call of op ``wait`` (``of``: the index of the async call) before it blocks and
returns after it: a rank stuck in a wait shows that wait, at the user's line, and which call it
waits for. In check mode the wait of an ``isend``/``irecv`` first verifies that the peer posted
the matching op (:mod:`repro.collectives.check.pairs`). Everything else is delegated to the real
object.

**A receive from any source** (``recv``/``irecv`` with ``src=None``) names no channel until it
completes: torch then tells the sender (``recv`` returns it, an ``irecv``'s work has
``_source_rank()``), and :func:`learn_source` numbers the receive on that channel, writes a
``source`` event (read back into the call's ``peer`` and ``pairs``) and, in check mode, hands it
to the pairing check.

Functional collectives and DTensor are traced by :mod:`repro.collectives.record.functional`, what
C++ issues (DDP's reducer, ``ProcessGroup`` methods called directly, and code that bound a
function by ``from torch.distributed import all_reduce`` before install) by
:mod:`repro.collectives.record.native` at the dispatcher; :mod:`repro.collectives.record.session`
installs them all.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from repro.collectives.callsite import sites_and_stack
from repro.collectives.check.checker import CollectiveMismatchError
from repro.collectives.events import CallRecord, is_any_source
from repro.collectives.record.ops import DEEPSPEED_CACHED, OP_SPECS
from repro.collectives.record.tracer import Tracer, active, inside

installed: list[tuple[Any, str, Any]] = []
"""(owner, attribute, original) of every function replaced, functional ops' included, for :func:`restore`."""


def wrap_work(result: Any, rec: CallRecord, tracer: Tracer) -> Any:
    """An async call's Work (or batch_isend_irecv's list of them) with its ``wait`` traced."""
    if isinstance(result, list):
        return [TracedWork(w, rec, tracer) for w in result]
    return TracedWork(result, rec, tracer)


def _make_wrapper(op: str, original: Callable) -> Callable:
    @functools.wraps(original)
    def traced(*args: Any, **kwargs: Any) -> Any:
        tracer = active()
        if tracer is None or getattr(inside, "depth", 0):
            return original(*args, **kwargs)
        try:
            rec = tracer.before(op, args, kwargs)
        except Exception as exc:
            if isinstance(exc, CollectiveMismatchError):
                raise
            # A tracer bug must not break the traced program: note it once and carry on.
            if not getattr(tracer, "_warned", False):
                tracer._warned = True
                print(f"repro.collectives_trace: could not record {op}: {exc!r}", file=sys.stderr)
            rec = None
        inside.depth = 1
        try:
            # Below Autograd the ProcessGroup op goes straight to its backend: the native kernel
            # (repro.collectives.record.native, for callers in C++) is not entered, since this call is
            # recorded already; entering Python from the dispatcher costs more than a small gloo call.
            with torch._C._AutoDispatchBelowAutograd():
                result = original(*args, **kwargs)
        except BaseException as exc:
            # A call that raised did not complete: it must not read as returned in a hang report.
            if rec is not None:
                tracer.write_event(
                    {"ev": "err", "index": rec.index, "t": time.time(), "error": repr(exc)[:200]}
                )
            raise
        finally:
            inside.depth = 0
        if rec is not None:
            tracer.after(rec)
            if rec.async_op and result is not None:
                return wrap_work(result, rec, tracer)
            if type(result) is int:  # recv returns its sender: learn_source takes it for src=None only
                learn_source(tracer, rec, result)
        return result

    traced.__repro_traced__ = original  # type: ignore[attr-defined]
    return traced


class _P2PWrapper:
    """isend/irecv wrapper that compares equal to the original (``P2POp`` checks ``op in [isend, irecv]``)."""

    def __init__(self, op: str, original: Callable) -> None:
        self._call = _make_wrapper(op, original)
        self.__repro_traced__ = original
        functools.update_wrapper(self, original)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return other is self or other is self.__repro_traced__

    def __hash__(self) -> int:
        return hash(self.__repro_traced__)


def _wrapper_for(op: str, original: Callable) -> Callable:
    return _P2PWrapper(op, original) if op in ("isend", "irecv") else _make_wrapper(op, original)


def _patch(owner: Any, attr: str, op: str, wrappers: dict[int, Callable]) -> None:
    original = getattr(owner, attr, None)
    if original is None or hasattr(original, "__repro_traced__"):
        return
    wrapper = wrappers.get(id(original))
    if wrapper is None:
        wrapper = wrappers[id(original)] = _wrapper_for(op, original)
    setattr(owner, attr, wrapper)
    installed.append((owner, attr, original))


def patch_deepspeed_backend() -> None:
    """Wrap the functions DeepSpeed's backend cached at start-up (call again after deepspeed.init_distributed)."""
    ds_comm = sys.modules.get("deepspeed.comm.comm")
    cdb = getattr(ds_comm, "cdb", None) if ds_comm else None
    if cdb is None:
        return
    for attr in DEEPSPEED_CACHED:
        fn = getattr(cdb, attr, None)
        if fn is None or hasattr(fn, "__repro_traced__"):
            continue
        op = getattr(fn, "__name__", "")
        if op in OP_SPECS:
            setattr(cdb, attr, _wrapper_for(op, fn))
            installed.append((cdb, attr, fn))

def patch_torch() -> None:
    """Wrap every function of :data:`~repro.collectives.record.ops.OP_SPECS` on ``torch.distributed``
    and ``distributed_c10d`` (one wrapper per original function)."""
    wrappers: dict[int, Callable] = {}
    for op in OP_SPECS:
        for owner in (c10d, dist):
            _patch(owner, op, op, wrappers)


def restore() -> None:
    """Put back every original function that :data:`installed` names."""
    while installed:
        owner, attr, original = installed.pop()
        if hasattr(getattr(owner, attr, None), "__repro_traced__"):
            setattr(owner, attr, original)


# -- async work and any-source receives ------------------------------------------------------


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


def learn_source(tracer: Any, rec: CallRecord, source: int) -> None:
    """An any-source receive completed from global rank ``source``: number it on that channel."""
    if source < 0 or not rec.pairs or not is_any_source(rec.pairs[0]):
        return
    with tracer._lock:
        seq = tracer.pairs.number("recv", rec.rank, source)
        rec.pairs[0] = ["recv", source, seq, *rec.pairs[0][3:]]
        rec.peer = source
        tracer.write_event({"ev": "source", "index": rec.index, "peer": source, "seq": seq})
    if tracer.checker is not None:
        tracer.checker.check_p2p(rec, tracer, block=False)
