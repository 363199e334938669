"""Record mode: wrap torch.distributed's collective and point-to-point functions.

Each wrapped call writes a ``call`` event (and runs the live check, when on) before the real call
and a ``ret`` event after it returns. Wrappers are installed on ``torch.distributed`` and
``torch.distributed.distributed_c10d`` (torch's own helpers such as ``all_gather_object`` call
through the latter), and on DeepSpeed's backend object, which caches the all-gather and
reduce-scatter functions it found at start-up. Everything DeepSpeed's ``deepspeed.comm`` does
ends in these functions, so it is covered once, without double records. A call made while
another traced call is running on the same thread (the ``broadcast`` inside
``broadcast_object_list``) is not recorded again.

Functional collectives and DTensor are traced by :mod:`repro.collectives.functional`, the waits
of async calls by :mod:`repro.collectives.work`, what C++ issues (DDP's reducer, ``ProcessGroup``
methods called directly, and code that bound a function by ``from torch.distributed import
all_reduce`` before install) by :mod:`repro.collectives.native` at the dispatcher.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from repro.collectives import functional, native
from repro.collectives.active import active, inside, set_active
from repro.collectives.callsite import sites_and_stack
from repro.collectives.events import SIZE_FREE_OPS, CallRecord, TraceFileWriter
from repro.collectives.groups import GroupInfo, dtype_name, p2p_peer
from repro.collectives.ops import DEEPSPEED_CACHED, LIST, OP_SPECS, P2P_LIST, PEER_OPS, TENSOR
from repro.collectives.p2p import BLOCKING, ROLE, PairCounter, learn_source
from repro.collectives.pending import PendingReturns
from repro.collectives.splits import split_numels

_installed: list[tuple[Any, str, Any]] = []  # (owner, attribute, original)


class Tracer:
    """One tracing session of this process: writes the rank file, numbers calls, runs the check."""

    def __init__(self, out_dir: str | os.PathLike, checker: Any | None = None, session: str = "0") -> None:
        self.out_dir = os.fspath(out_dir)
        self.checker = checker
        self.session = session
        self.rank: int | None = None
        self._writer: TraceFileWriter | None = None
        self._index = 0
        self._group_seq: dict[str, int] = {}
        self._groups: dict[int, GroupInfo] = {}
        self._history: dict[str, deque[CallRecord]] = {}
        self.pairs = PairCounter()
        self._lock = threading.Lock()
        self.pending = PendingReturns(self)

    # -- file ---------------------------------------------------------------------------------
    def _open(self) -> TraceFileWriter:
        import pathlib

        self.rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
        self._writer = TraceFileWriter(pathlib.Path(self.out_dir) / f"rank{self.rank}.jsonl")
        self._writer.write(
            {
                "ev": "meta",
                "rank": self.rank,
                "world_size": dist.get_world_size() if dist.is_initialized() else None,
                "backend": dist.get_backend() if dist.is_initialized() else None,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "check": self.checker.mode.text if self.checker else "off",
                "session": self.session,
                "t": time.time(),
                "torch": torch.__version__,
                "argv": sys.argv,
            }
        )
        return self._writer

    def group_seq(self, group: str) -> int:
        """How many collectives this rank has issued on ``group`` in this session."""
        return self._group_seq.get(group, 0)

    def write_event(self, event: dict[str, Any]) -> None:
        (self._writer or self._open()).write(event)

    def write_lines(self, lines: list[str]) -> None:
        """Events already formatted as JSON objects, in one write."""
        (self._writer or self._open()).write_line("\n".join(lines))

    def posted(self, rec: CallRecord, work: Any) -> None:
        """An async call issued from C++ is on its way: its ``ret`` is written once ``work`` completes."""
        with self._lock:
            self.pending.add(rec.index, work)

    def close(self) -> None:
        self.pending.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # -- calls --------------------------------------------------------------------------------
    def _group(self, group: Any) -> GroupInfo:
        info = self._groups.get(id(group))
        if info is None:
            info = GroupInfo(group)
            self._groups[id(group)] = info
            if info.member:
                self.write_event({"ev": "group", "group": info.key, "ranks": list(info.ranks)})
        return info

    def describe(self, op: str, args: tuple, kwargs: dict) -> CallRecord | None:
        """The record of a call about to be made, or None when this rank is not in its group."""
        names, tensor_param, count, root_param, group_root_param, redop_param = OP_SPECS[op]
        params = dict(zip(names, args, strict=False))
        params.update(kwargs)
        numel, dtype, detail = 0, "", []
        value = params.get(tensor_param) if tensor_param else None
        if count == TENSOR and value is not None:
            numel, dtype = value.numel(), dtype_name(value.dtype)
        elif count == LIST and value:
            numel, dtype = sum(t.numel() for t in value), dtype_name(value[0].dtype)
        elif count == P2P_LIST and value:
            params["group"] = value[0].group
        info = self._group(params.get("group"))
        if not info.member:
            return None
        if count == P2P_LIST and value:
            detail = [
                [p.op.__name__, p2p_peer(p, info), p.tensor.numel(), dtype_name(p.tensor.dtype)]
                for p in value
            ]
            numel, dtype = sum(d[2] for d in detail), detail[0][3]
        root = params.get(root_param) if root_param else None
        if root is None and group_root_param and params.get(group_root_param) is not None:
            root = info.ranks[params[group_root_param]]
        redop = params.get(redop_param) if redop_param else None
        if redop is None and redop_param:
            redop = "SUM"
        size_free = op in SIZE_FREE_OPS or (
            op == "all_to_all_single"
            and (params.get("input_split_sizes") or params.get("output_split_sizes"))
        )
        is_p2p = op in PEER_OPS or op == "batch_isend_irecv"
        if not is_p2p:
            self._group_seq[info.key] = seq = self._group_seq.get(info.key, 0) + 1
        self._index += 1
        peer = root if op in PEER_OPS else None
        me = self.rank if self.rank is not None else -1
        if op in PEER_OPS:
            pairs = [[ROLE[op], peer, self.pairs.number(ROLE[op], me, peer), numel, dtype, op]]
        else:
            pairs = [
                [ROLE[d[0]], d[1], self.pairs.number(ROLE[d[0]], me, d[1]), d[2], d[3], d[0]] for d in detail
            ]
        if op in ("all_to_all", "all_to_all_single"):
            detail = split_numels(op, params, len(info.ranks))
        # The walk skips this tracer's own frames (before, the wrapper), so start right here.
        site, lib_site, stack = sites_and_stack(sys._getframe(1))
        return CallRecord(
            rank=self.rank if self.rank is not None else -1,
            index=self._index,
            op=op,
            group=info.key,
            ranks=info.ranks,
            group_seq=None if is_p2p else seq,
            numel=numel,
            dtype=dtype,
            site=site,
            lib_site=lib_site,
            t=time.time(),
            root=root if op not in PEER_OPS else None,
            peer=peer,
            redop=None if redop is None else str(redop).rsplit(".", 1)[-1],
            async_op=bool(params.get("async_op", False)) or op in ("isend", "irecv", "batch_isend_irecv"),
            size_free=bool(size_free),
            detail=detail,
            pairs=pairs,
            stack=stack,
        )

    def before(self, op: str, args: tuple, kwargs: dict) -> CallRecord | None:
        with self._lock:
            if self._writer is None:
                self._open()
            self.pending.flush()
            rec = self.describe(op, args, kwargs)
            if rec is None:
                return None
            previous = self._write_call(rec)
        self._check(rec, previous)
        return rec

    def before_native(
        self, op: str, group: Any, numel: int, dtype: str, root: int | None, size_free: bool, issuer: Any
    ) -> CallRecord | None:
        """A collective a library issued from C++ (:mod:`repro.collectives.native`): record, then check.

        ``root`` is a group rank, as the ProcessGroup op takes it; ``issuer(rec)`` names the
        mechanism (DDP's bucket, its unused-parameter bitmap) once the call is described.
        """
        with self._lock:
            if self._writer is None:
                self._open()
            self.pending.flush()
            info = self._group(group)
            if not info.member:
                return None
            self._group_seq[info.key] = seq = self._group_seq.get(info.key, 0) + 1
            self._index += 1
            site, lib_site, stack = sites_and_stack(sys._getframe(2))
            rec = CallRecord(
                rank=self.rank if self.rank is not None else -1,
                index=self._index,
                op=op,
                group=info.key,
                ranks=info.ranks,
                group_seq=seq,
                numel=numel,
                dtype=dtype,
                site=site,
                lib_site=lib_site,
                t=time.time(),
                root=None if root is None else info.ranks[root],
                size_free=size_free,
                stack=stack,
            )
            rec.issuer = issuer(rec) if issuer is not None else None
            previous = self._write_call(rec)
        self._check(rec, previous)
        return rec

    def _write_call(self, rec: CallRecord) -> list[CallRecord]:
        """Write the call event (under the lock); the group's calls before it, for the check's report."""
        event = rec.to_json()
        event["ev"] = "call"
        for key in ("detail", "pairs", "of", "issuer"):
            if not event[key]:
                del event[key]
        del event["t_end"]
        self._writer.write(event)
        if rec.group_seq is None:
            return []
        hist = self._history.setdefault(rec.group, deque(maxlen=4))
        previous = list(hist)
        hist.append(rec)
        return previous

    def _check(self, rec: CallRecord, previous: list[CallRecord]) -> None:
        if self.checker is not None:
            if rec.group_seq is not None:
                self.checker.check(rec, previous, self)
            elif rec.pairs:
                self.checker.check_p2p(rec, self, block=rec.op in BLOCKING)

    def after(self, rec: CallRecord) -> None:
        # Formatted by hand: json.dumps of this fixed shape was a tenth of the per-call cost.
        self._writer.write_line(f'{{"ev":"ret","index":{rec.index},"t":{time.time()!r}}}')


def wrap_work(result: Any, rec: CallRecord, tracer: Tracer) -> Any:
    """An async call's Work (or batch_isend_irecv's list of them) with its ``wait`` traced."""
    from repro.collectives.work import TracedWork

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
            from repro.collectives.check.checker import CollectiveMismatchError

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
            # (repro.collectives.native, for callers in C++) is not entered, since this call is
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
    _installed.append((owner, attr, original))


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
            _installed.append((cdb, attr, fn))


def install(tracer: Tracer) -> None:
    """Make ``tracer`` the active one and wrap the torch.distributed functions (idempotent)."""
    current = active()
    if current is not None and current is not tracer:
        raise RuntimeError("another collective trace is already active in this process")
    if not _installed:
        wrappers: dict[int, Callable] = {}
        for op in OP_SPECS:
            for owner in (c10d, dist):
                _patch(owner, op, op, wrappers)
        functional.install(_installed)
    native.install()
    patch_deepspeed_backend()
    set_active(tracer)


def uninstall() -> None:
    """Stop tracing and put every original function back."""
    current = active()
    if current is not None:
        current.close()
    set_active(None)
    functional.clear()
    native.uninstall()
    while _installed:
        owner, attr, original = _installed.pop()
        if hasattr(getattr(owner, attr, None), "__repro_traced__"):
            setattr(owner, attr, original)
