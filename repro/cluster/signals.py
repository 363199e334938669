"""Signals in the driver: SIGTERM as Ctrl-C, Ray's SIGTERM handler undone, quiet cleanup.

The driver turns SIGTERM into the ``KeyboardInterrupt`` that Ctrl-C raises (:func:`terminate_as_interrupt`),
so both take one path through the trainer's ``finally`` blocks. ``ray.init`` installs a handler
that turns SIGTERM into an abort, so the worker group puts ours back (:func:`reclaim_sigterm`). A
second signal while cleanup runs is ignored (:func:`ignore_signals`). What the run records on an
interrupt is ``repro.run.interrupts``'s.

A SIGTERM is seldom the driver's alone: GNU timeout and ``kill -TERM -<pgid>`` signal the job's
process group, where a local Ray instance's GCS and raylet live (Ray blocks SIGINT in them, not
SIGTERM), and a batch system or systemd may signal every process of the job. A GCS stopping on
it takes requests and never answers, so a synchronous call to it waits until Ray's GCS client
gives up after 60 s and aborts the driver (exit 1, nothing recorded; seen under ``timeout``,
2026-11-27). After a SIGTERM (:func:`sigterm_received`) the stop therefore makes no call that
waits on the GCS: what such calls would free, Ray frees with the driver.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_active = False
_sigterm = False


def _raise_interrupt(signum: int, frame: object) -> None:
    global _sigterm
    _sigterm = True
    raise KeyboardInterrupt(signal.Signals(signum).name)


def sigterm_received() -> bool:
    """Whether a SIGTERM arrived within the current :func:`terminate_as_interrupt` block (the stop
    of this run); Ray's own processes may have it too (module docstring)."""
    return _sigterm


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises ``KeyboardInterrupt`` in the main thread (as Ctrl-C does)."""
    global _active, _sigterm
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    _active, _sigterm = True, False
    try:
        yield
    finally:
        _active, _sigterm = False, False  # a later run in this process starts afresh
        signal.signal(signal.SIGTERM, previous)


def reclaim_sigterm() -> None:
    """Put the SIGTERM handler back after ``ray.init``, whose core worker installs a crash handler
    that turns SIGTERM into an abort (exit -6, no cleanup, orphans left)."""
    if _active and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_interrupt)


@contextlib.contextmanager
def ignore_signals() -> Iterator[None]:
    """SIGINT and SIGTERM are ignored within the block (the cleanup after the first one)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
