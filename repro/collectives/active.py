"""The tracer recording in this process, and the per-thread "a traced call is running" flag.

Its own module so that ``record`` (which installs a tracer), ``functional``, ``work`` and
``native`` (which ask for it on every call) do not import each other. The flag stops a call from
being recorded twice: a ``torch.distributed`` function (or functional op) that the tracer wrapped
reaches the same C++ ProcessGroup op that :mod:`repro.collectives.native` traces for callers
in C++ (DDP's reducer), and the object collectives call other wrapped functions.
"""

from __future__ import annotations

import threading
from typing import Any

_tracer: Any = None
inside = threading.local()
"""``inside.depth`` is 1 on a thread while a traced call runs there (absent: 0)."""


def active() -> Any:
    """The tracer now recording in this process (a ``record.Tracer``), if any."""
    return _tracer


def set_active(tracer: Any) -> None:
    global _tracer
    _tracer = tracer
