"""Which library mechanism issued a collective from C++, and the rank-local settings that shape it.

DDP's reducer issues a recognizable sequence: one all_reduce per gradient bucket (the
parameters' dtype) in ``backward()`` and, with ``find_unused_parameters=True``, one more of an
int32 bitmap with one element per parameter; in the first forward after the first backward it
broadcasts the rebuilt bucket order (int32). Each ``DistributedDataParallel`` built while tracing
is remembered with its settings and the user line that built it, so a record can say "DDP's
unused-parameter bitmap (find_unused_parameters=True, DDP built at train.py:14)" and a report can
name a setting that differs between ranks as the cause (:func:`repro.collectives.analyze.report.cause`).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

from repro.collectives.callsite import current_sites

_ddps: list[tuple[weakref.ref, dict[str, Any]]] = []
_original_init: Any = None


def _ddp_class() -> Any:
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return None
    return DistributedDataParallel


def install() -> None:
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


def uninstall() -> None:
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


def describe(rec: Any) -> str | None:
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
