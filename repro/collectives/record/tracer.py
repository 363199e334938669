"""The tracer: one process's record - its file, the numbering of its calls, what each call is.

:class:`Tracer` opens ``rank{R}.jsonl``, describes a call about to run (op, group, sizes, root,
reduce op, call sites; group sequence numbers per process group and point-to-point numbers per
channel, :class:`PairCounter`), writes its ``call`` event before it runs and its ``ret`` after,
and hands it to the live check when one is on (the session's ``Checker``). The returns of async
calls a library issued from C++ are written once they are seen complete (:class:`PendingReturns`).

:func:`active` is the tracer recording in this process, asked on every call by the interception
points (:mod:`repro.collectives.record.patches` for torch.distributed's Python functions,
:mod:`~repro.collectives.record.functional`, :mod:`~repro.collectives.record.native`), which this
module does not import. The per-thread ``inside`` flag stops a call from being recorded twice: a
``torch.distributed`` function (or functional op) that the tracer wrapped reaches the same C++
ProcessGroup op that :mod:`repro.collectives.record.native` traces for callers in C++ (DDP's
reducer), and the object collectives call other wrapped functions.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections import deque
from typing import Any

import torch
import torch.distributed as dist

from repro.collectives.callsite import sites_and_stack
from repro.collectives.events import SIZE_FREE_OPS, CallRecord, TraceFileWriter, channel
from repro.collectives.record.ops import (
    BLOCKING,
    LIST,
    OP_SPECS,
    P2P_LIST,
    PEER_OPS,
    ROLE,
    TENSOR,
    GroupInfo,
    dtype_name,
    p2p_peer,
    split_numels,
)

_tracer: Any = None
inside = threading.local()
"""``inside.depth`` is 1 on a thread while a traced call runs there (absent: 0)."""


def active() -> Any:
    """The :class:`Tracer` now recording in this process, if any."""
    return _tracer


def set_active(tracer: Any) -> None:
    global _tracer
    _tracer = tracer


def _strided(value: Any) -> bool:
    """A non-contiguous tensor, or a list holding one (tensors, or P2P ops and their tensors): NCCL
    refuses such a tensor where gloo takes it (``CallRecord.strided``)."""
    if isinstance(value, torch.Tensor):
        return not value.is_contiguous()
    if isinstance(value, (list, tuple)):
        return any(_strided(getattr(v, "tensor", v)) for v in value)
    return False


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


POLL_S = 0.2  # how often the daemon thread of PendingReturns asks the works


class PendingReturns:
    """Posted async works of one tracer whose ``ret`` is not written yet.

    Returns of async calls a library issued from C++ (DDP's buckets) are written once seen complete.

    A Python callback on the work's future would run on the backend's worker thread, which must then
    take the GIL from the training thread: the worker stalls before it starts the next bucket. In the
    profile of a traced DDP step on 2 gloo ranks this handoff cost more than everything else the
    tracer does per call (a 1-element all_reduce from the dispatcher: 228 us traced with the callback,
    95 us without, 12 us untraced). Instead the tracer keeps the posted works and asks each whether it
    completed (a C++ call that needs no other thread) at its next traced call, and a daemon thread asks
    every :data:`POLL_S` seconds, so that a rank that goes quiet after its last bucket does not look
    stuck in it to the hang watch (:mod:`repro.collectives.launch.stall`, which waits seconds, not
    milliseconds). A ``ret`` thus carries the time it was seen, at most :data:`POLL_S` late.
    """

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
        strided = [name for name, v in params.items() if _strided(v)]
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
            strided=strided,
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
        """A collective a library issued from C++ (:mod:`repro.collectives.record.native`): record, then check.

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
        for key in ("detail", "pairs", "of", "issuer", "strided"):
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
