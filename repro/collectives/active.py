"""The tracer recording in this process: one slot that the wrappers, functional ops and waits read.

Its own module so that ``record`` (which installs a tracer), ``functional`` and ``work`` (which
ask for it on every call) do not import each other.
"""

from __future__ import annotations

from typing import Any

_tracer: Any = None


def active() -> Any:
    """The tracer now recording in this process (a ``record.Tracer``), if any."""
    return _tracer


def set_active(tracer: Any) -> None:
    global _tracer
    _tracer = tracer
