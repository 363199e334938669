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
:data:`repro.collectives.active.inside` set and passes straight through.

Async calls (the reducer's buckets are) get their ``ret`` when their work completes, not when
they were posted, so a rank stuck waiting on one shows it outstanding to the hang watch.
Point-to-point ops from C++ are not traced here (their pairing needs the Python path's numbering).
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from repro.collectives import issuers
from repro.collectives.active import active, inside
from repro.collectives.groups import dtype_name

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
                issuers.describe,
            )
        except Exception as exc:
            from repro.collectives.check.checker import CollectiveMismatchError

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
    issuers.install()
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
    issuers.uninstall()
