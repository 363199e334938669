"""Functional collectives and DTensor: the ``torch.ops._c10d_functional`` ops, eager and compiled.

``torch.distributed._functional_collectives`` and everything built on it (DTensor's
``redistribute``, tensor parallelism's ``parallelize_module``, FSDP2's helpers) call
``torch.ops._c10d_functional.<op>(...)``, looking the op up on the namespace object at each call.
Replacing those namespace attributes with wrappers sees every eager call with the user's Python
stack, without the per-op cost of a dispatch mode. Each call is recorded (and checked) as the
``torch.distributed`` call it equals on the wire - ``all_reduce``, ``all_gather_into_tensor``,
``reduce_scatter_tensor``, ``all_to_all_single`` (splits checked), ``broadcast``, ``isend``/``irecv``
- so a rank using DTensor and one using ``dist.all_reduce`` are compared like for like. The
result tensor is remembered and its ``wait_tensor`` is traced as the ``wait`` of that call.

Code compiled by ``torch.compile`` (backends eager, aot_eager and inductor) calls the op
overloads (``torch.ops._c10d_functional.all_reduce.default``, inductor's in-place
``all_reduce_``) from its graph, not through the namespace. Those ops have no autograd kernel of
their own, so a Python kernel registered for them at the Autograd dispatch keys (as
:mod:`repro.collectives.record.native` does for ``c10d``) runs before torch's and records the same way;
the call site is the user's line, read from the graph node's ``stack_trace`` by
:mod:`repro.collectives.callsite` (inductor's generated code has none: its calls show the
compiled function's ``def`` line). While compiling, torch runs the same ops on fake or functional
tensors under its tracing modes: those calls pass through unrecorded, and the namespace wrapper
gives Dynamo torch's op, so the graph holds no tracer code. The ``_c10d_functional_autograd``
ops (with autograd kernels of their own) are seen only eagerly.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed.distributed_c10d as c10d
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor

from repro.collectives.events import CallRecord
from repro.collectives.record.patches import traced_wait
from repro.collectives.record.tracer import active, inside

NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")
_groups: dict[str, Any] = {}
_pending: dict[int, tuple[CallRecord, Any]] = {}  # id(result tensor) -> (its call, the tensor)
_library: Any = None  # the compiled-code kernels while installed


def _group(name: Any) -> Any:
    if not isinstance(name, str):
        return name  # already a ProcessGroup
    pg = _groups.get(name)
    if pg is None:
        # one object per name: the tracer caches groups by identity
        pg = _groups[name] = c10d._resolve_process_group(name)
    return pg


def _meta(like: torch.Tensor, rows: int) -> torch.Tensor:
    """A shape-only stand-in for an output the functional op allocates itself."""
    return torch.empty((rows, *like.shape[1:]), dtype=like.dtype, device="meta")


def _redop(name: str) -> str:
    return name.upper()


# functional op -> (the torch.distributed op it equals, its (args, kwargs) from the functional args)
def _as_c10d(op: str, a: tuple) -> tuple[str, tuple, dict] | None:
    op = op.rstrip("_")  # the in-place all_reduce_ (inductor's) is the same call on the wire
    if op == "all_reduce":
        return "all_reduce", (a[0],), {"op": _redop(a[1]), "group": _group(a[2])}
    if op == "all_reduce_coalesced":
        return "all_reduce_coalesced", (list(a[0]),), {"op": _redop(a[1]), "group": _group(a[2])}
    if op == "all_gather_into_tensor":
        return "all_gather_into_tensor", (None, a[0]), {"group": _group(a[2])}
    if op == "all_gather_into_tensor_coalesced":
        return "all_gather_coalesced", (None, list(a[0])), {"group": _group(a[2])}
    if op == "reduce_scatter_tensor":
        out = _meta(a[0], a[0].shape[0] // a[2]) if a[0].dim() else a[0]
        return "reduce_scatter_tensor", (out, a[0]), {"op": _redop(a[1]), "group": _group(a[3])}
    if op == "all_to_all_single":
        out_splits, in_splits = [int(s) for s in a[1]], [int(s) for s in a[2]]
        out = _meta(a[0], sum(out_splits)) if out_splits else _meta(a[0], a[0].shape[0])
        return (
            "all_to_all_single",
            (out, a[0], out_splits or None, in_splits or None),
            {"group": _group(a[3])},
        )
    if op == "broadcast":
        return "broadcast", (a[0], a[1]), {"group": _group(a[2])}
    if op in ("isend", "irecv"):
        return op, (a[0], a[1]), {"group": _group(a[3])}
    return None


class _Traced:
    """A functional op's packet, traced when called; everything else (``.default``, schemas) delegated."""

    def __init__(self, op: str, packet: Any) -> None:
        self._op = op
        self.__repro_traced__ = packet

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__repro_traced__, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        packet = self.__repro_traced__
        # Dynamo inlines this wrapper when it compiles a function: the graph must hold torch's op
        # (the tracer's file writes cannot be traced); the compiled call reaches _compiled_kernel.
        # On the GPU machine's torch 2.11, AOT's tracing called this wrapper again, on fake tensors under
        # its modes (the graph held the wrapper): not a collective on the wire, so not recorded.
        if kwargs or torch.compiler.is_compiling() or _tracing_modes() or _traced_tensors(args):
            return packet(*args, **kwargs)
        tracer = active()
        return packet(*args) if tracer is None else _traced_call(tracer, self._op, packet, args)


def _traced_call(tracer: Any, op: str, packet: Any, args: tuple) -> Any:
    """``packet(*args)`` recorded (and checked) as the torch.distributed call it equals."""
    if op == "wait_tensor":
        entry = _pending.pop(id(args[0]), None)
        if entry is None:
            return packet(*args)
        return traced_wait(entry[0], tracer, packet, args, {})
    call = _as_c10d(op, args)
    rec = tracer.before(call[0], call[1], {**call[2], "async_op": True}) if call else None
    inside.depth = 1  # its ProcessGroup op below is this call, not another
    try:
        result = packet(*args)
    finally:
        inside.depth = 0
    if rec is not None:
        tracer.after(rec)
        for t in result if isinstance(result, (list, tuple)) else (result,):
            _pending[id(t)] = (rec, t)  # the tensor kept alive: its id stays unique until waited
    return result


_OPS = (
    "all_reduce",
    "all_reduce_",
    "all_reduce_coalesced",
    "all_reduce_coalesced_",
    "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "broadcast",
    "isend",
    "irecv",
    "wait_tensor",
)


def install(installed: list[tuple[Any, str, Any]]) -> None:
    """Wrap the functional ops on their namespaces; each replacement is appended to ``installed``."""
    for ns_name in NAMESPACES:
        ns = getattr(torch.ops, ns_name)
        for op in _OPS:
            try:
                packet = getattr(ns, op)
            except (AttributeError, RuntimeError):
                continue  # this namespace has no such op (the autograd one holds three)
            if hasattr(packet, "__repro_traced__"):
                continue
            setattr(ns, op, _Traced(op, packet))
            installed.append((ns, op, packet))
    _install_kernels()


_MODE_KEYS = tuple(
    getattr(torch._C._TorchDispatchModeKey, k)
    for k in ("FAKE", "PROXY", "FUNCTIONAL")
    if hasattr(torch._C._TorchDispatchModeKey, k)
)


def _tracing_modes() -> bool:
    """Whether one of torch's tracing modes (fake, proxy, functional) is active."""
    # Only torch's tracing modes: AOT's runtime may run the real graph under a mode of its own.
    return any(torch._C._get_dispatch_mode(k) is not None for k in _MODE_KEYS)


def _traced_tensors(args: tuple) -> bool:
    """Whether an argument is a tensor torch traces with (fake or functional), which never reaches the wire."""
    return any(isinstance(a, (FakeTensor, FunctionalTensor)) for a in args)


def _tracing(args: tuple) -> bool:
    """Whether this call is torch.compile tracing the graph (fake or functional tensors), not running it.

    Below autograd, any tensor subclass is one of tracing's wrappers; the namespace wrapper above sees
    the user's own subclasses (an unwaited ``AsyncCollectiveTensor`` chained into the next
    collective), so it asks the narrower :func:`_traced_tensors`.
    """
    return _tracing_modes() or any(isinstance(a, torch.Tensor) and type(a) not in _PLAIN for a in args)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _compiled_kernel(op: str, overload: Any) -> Any:
    def below(*args: Any) -> Any:
        with torch._C._AutoDispatchBelowAutograd():
            return overload(*args)

    def kernel(*args: Any) -> Any:
        tracer = active()
        if tracer is None or getattr(inside, "depth", 0) or _tracing(args):
            return below(*args)
        return _traced_call(tracer, op, below, args)

    return kernel


def _install_kernels() -> None:
    """Kernels for the ``_c10d_functional`` overloads at the Autograd keys: compiled code calls them.

    Those ops have no autograd kernel of their own (the Autograd keys fall back to torch's
    pass-through), so nothing of torch's is replaced. The ``_c10d_functional_autograd`` ops have
    one and are left alone.
    """
    global _library
    if _library is not None:
        return
    lib = _library = torch.library.Library("_c10d_functional", "IMPL")
    for op in _OPS:
        try:
            overload = getattr(torch.ops._c10d_functional, op).default
        except (AttributeError, RuntimeError):
            continue
        for key in ("AutogradCPU", "AutogradCUDA"):
            lib.impl(op, _compiled_kernel(op, overload), key)


def clear() -> None:
    """Forget pending results and groups; take the kernels out (the dispatcher falls back to torch's)."""
    global _library
    _pending.clear()
    _groups.clear()
    if _library is not None:
        _library._destroy()
        _library = None
