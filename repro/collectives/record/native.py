"""Collectives a library issues from C++: DDP's reducer, ``ProcessGroup`` methods, compiled code.

DDP's gradient buckets and unused-parameter bitmap, its start-up parameter checks and the
collectives of ``torch.compile``d code never pass through ``torch.distributed``'s Python
functions. Every one of them, like every Python collective, ends in a ``c10d::<op>_`` operator of
the dispatcher (``ProcessGroup::allreduce`` and the rest look it up there). A Python kernel
registered for those operators at the Autograd dispatch key (the ProcessGroup ops have none of
their own, so nothing of torch's is replaced) runs before the backend's kernel, holding the
calling thread's Python stack - for DDP, the user's ``loss.backward()`` line and the loop around
it. It records and checks the call exactly as the Python wrappers do, then redispatches below
Autograd to the real kernel. A call that a Python wrapper already traces reaches this kernel with
:data:`repro.collectives.record.tracer.inside` set and passes straight through.

Async calls (the reducer's buckets are) get their ``ret`` when their work completes, not when
they were posted, so a rank stuck waiting on one shows it outstanding to the hang watch.
Point-to-point ops from C++ are not traced here (their pairing needs the Python path's numbering).

**Which library mechanism issued it** (:func:`issuer_of`), and the rank-local settings that shape
it. DDP's reducer issues a recognizable sequence: one all_reduce per gradient bucket (the
parameters' dtype) in ``backward()`` and, with ``find_unused_parameters=True``, one more of an
int32 bitmap with one element per parameter; in the first forward after the first backward it
broadcasts the rebuilt bucket order (int32). Each ``DistributedDataParallel`` built while tracing
is remembered with its settings and the user line that built it, so a record can say "DDP's
unused-parameter bitmap (find_unused_parameters=True, DDP built at train.py:14)" and a report can
name a setting that differs between ranks as the cause (:func:`repro.collectives.analyze.report.cause`).
"""

from __future__ import annotations

import functools
import sys
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from repro.collectives.callsite import current_sites
from repro.collectives.check.checker import CollectiveMismatchError
from repro.collectives.record.ops import dtype_name
from repro.collectives.record.tracer import active, inside

# c10d operator -> (our op name, index of the tensor(s) counted, index of the group,
#                   index of the root (a group rank) or None, whether sizes may differ by rank)
NATIVE_OPS: dict[str, tuple[str, int, int, int | None, bool]] = {
    "allreduce_": ("all_reduce", 0, 1, None, False),
    "allreduce_coalesced_": ("all_reduce_coalesced", 0, 1, None, False),
    "broadcast_": ("broadcast", 0, 1, 2, False),
    "reduce_": ("reduce", 0, 1, 3, False),
    "allgather_": ("all_gather", 1, 2, None, False),
    "_allgather_base_": ("all_gather_into_tensor", 1, 2, None, False),
    "allgather_coalesced_": ("all_gather_coalesced", 1, 2, None, False),
    "allgather_into_tensor_coalesced_": ("all_gather_coalesced", 1, 2, None, False),
    "reduce_scatter_": ("reduce_scatter", 0, 2, None, False),
    "_reduce_scatter_base_": ("reduce_scatter_tensor", 0, 2, None, False),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter_coalesced", 0, 2, None, False),
    "alltoall_base_": ("all_to_all_single", 1, 2, None, True),
    "alltoall_": ("all_to_all", 1, 2, None, True),
    "gather_": ("gather", 1, 2, 3, False),
    "scatter_": ("scatter", 0, 2, 3, False),
    "barrier": ("barrier", 0, 1, None, True),
    "monitored_barrier_": ("monitored_barrier", 0, 1, None, True),
}
DISPATCH_KEYS = ("AutogradCPU", "AutogradCUDA")
_library: Any = None


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


_boxed_types: dict[tuple[type, Any], bool] = {}


def _unbox(obj: Any, cls: Any) -> Any:
    # isinstance against these classes goes through a Python metaclass hook: ask once per type.
    key = (type(obj), cls)
    boxed = _boxed_types.get(key)
    if boxed is None:
        boxed = _boxed_types[key] = getattr(cls, "unbox", None) is not None and not isinstance(obj, cls)
    return cls.unbox(obj) if boxed else obj


def _kernel(name: str, packet: Any) -> Callable:
    op, tensor_at, group_at, root_at, size_free = NATIVE_OPS[name]
    # The operator called boxed through its handle: the OpOverload's __call__ first scans every
    # argument for fake script objects (for export), and its C++ entry point looks for
    # __torch_function__ on each (an exception caught per ScriptObject argument). On a
    # 1-element gloo all_reduce: 43 us of CPU through ``_op``, 21 us boxed, 12 us untraced.
    handle = getattr(packet, "_handle", None)
    call_boxed = getattr(torch._C, "_dispatch_call_boxed", None)
    if handle is not None and call_boxed is not None:
        packet = functools.partial(call_boxed, handle)
    else:
        packet = getattr(packet, "_op", packet)

    def kernel(*args: Any) -> Any:
        tracer = active()
        if tracer is None or getattr(inside, "depth", 0):
            with torch._C._AutoDispatchBelowAutograd():
                return packet(*args)
        rec = None
        try:
            tensors = _tensors(args[tensor_at])
            group = _unbox(args[group_at], dist.ProcessGroup)
            rec = tracer.before_native(
                op,
                group,
                sum(t.numel() for t in tensors),
                dtype_name(tensors[0].dtype) if tensors and op not in ("barrier", "monitored_barrier") else "",
                None if root_at is None else int(args[root_at]),
                size_free,
                issuer_of,
            )
        except Exception as exc:
            if isinstance(exc, CollectiveMismatchError):
                raise
            if not getattr(tracer, "_warned", False):  # a tracer bug must not break the program
                tracer._warned = True
                print(f"repro.collectives_trace: could not record c10d::{name}: {exc!r}", file=sys.stderr)
        inside.depth = 1
        try:
            with torch._C._AutoDispatchBelowAutograd():
                result = packet(*args)
        except BaseException as exc:
            if rec is not None:
                tracer.write_event({"ev": "err", "index": rec.index, "t": time.time(), "error": repr(exc)[:200]})
            raise
        finally:
            inside.depth = 0
        if rec is not None:
            work = result[-1] if isinstance(result, tuple) else result
            if work is not None and not isinstance(work, (torch.Tensor, list)):
                try:
                    tracer.posted(rec, _unbox(work, dist.distributed_c10d.Work))
                except Exception:  # a work that cannot be unboxed counts as returned once posted
                    tracer.after(rec)
            else:
                tracer.after(rec)
        return result

    return kernel


def install() -> None:
    """Register the kernels (idempotent); ops or keys this torch lacks are skipped."""
    global _library
    if _library is not None:
        return
    _remember_ddps()
    try:
        lib = torch.library.Library("c10d", "IMPL")
    except Exception:
        return
    for name in NATIVE_OPS:
        try:
            packet = getattr(torch.ops.c10d, name).default
        except (AttributeError, RuntimeError):
            continue
        for key in DISPATCH_KEYS:
            try:
                lib.impl(name, _kernel(name, packet), key)
            except Exception:
                continue
    _library = lib


def uninstall() -> None:
    """Take the kernels out again (the dispatcher falls back to torch's own)."""
    global _library
    if _library is not None:
        _library._destroy()
        _library = None
    _forget_ddps()


# -- which mechanism issued it ------------------------------------------------------------------

_ddps: list[tuple[weakref.ref, dict[str, Any]]] = []
_original_init: Any = None


def _ddp_class() -> Any:
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return None
    return DistributedDataParallel


def _remember_ddps() -> None:
    """Remember every DDP built from now on (its class's ``__init__`` wrapped once)."""
    global _original_init
    cls = _ddp_class()
    if cls is None or _original_init is not None:
        return
    _original_init = original = cls.__init__

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            settings = {
                "find_unused_parameters": bool(getattr(self, "find_unused_parameters", False)),
                "static_graph": bool(getattr(self, "static_graph", False)),
                "bucket_cap_mb": round(getattr(self, "bucket_bytes_cap", 0) / 2**20, 2),
                "params": sum(1 for p in self.module.parameters() if p.requires_grad),
                "built_at": current_sites()[0],
            }
            _ddps.append((weakref.ref(self), settings))
        except Exception:  # describing is best effort; the job must not notice
            pass

    cls.__init__ = init


def _forget_ddps() -> None:
    global _original_init
    cls = _ddp_class()
    if cls is not None and _original_init is not None:
        cls.__init__ = _original_init
    _original_init = None
    _ddps.clear()


def _live_ddps() -> list[dict[str, Any]]:
    return [s for ref, s in _ddps if ref() is not None]


def _settings_text(s: dict[str, Any]) -> str:
    return (
        f"find_unused_parameters={s['find_unused_parameters']}, static_graph={s['static_graph']}, "
        f"bucket_cap_mb={s['bucket_cap_mb']:g}; DDP built at {s['built_at']}"
    )


def issuer_of(rec: Any) -> str | None:
    """The mechanism behind a call issued from C++ (``rec`` is its CallRecord), or None."""
    lib = rec.lib_site or ""
    ddps = _live_ddps()
    if ddps and ("torch/autograd/" in lib or "nn/parallel/distributed.py" in lib):
        if rec.op == "all_reduce" and rec.dtype == "int32":
            bitmap = [s for s in ddps if s["find_unused_parameters"] and s["params"] == rec.numel]
            if bitmap:
                return f"DDP reducer: unused-parameter bitmap, one int per parameter ({_settings_text(bitmap[-1])})"
        if rec.op == "all_reduce" and "torch/autograd/" in lib:
            return f"DDP reducer: gradient bucket in backward ({_settings_text(ddps[-1])})"
        if rec.op == "broadcast" and rec.dtype == "int32" and "_pre_forward" in lib:
            return (
                "DDP: broadcast of the rebuilt bucket order, first forward after the first backward "
                f"({_settings_text(ddps[-1])})"
            )
        if "nn/parallel/distributed.py" in lib:
            return f"DDP, in {lib.rsplit(' ', 1)[-1]} ({_settings_text(ddps[-1])})"
    return f"issued from C++ below {lib}" if lib else "issued from C++"
