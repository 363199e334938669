"""A trace session in this process: start, stop, the context manager, the env-var switch, and install.

:func:`install` puts every interception point in place - torch.distributed's Python functions
and DeepSpeed's cached ones (:mod:`~repro.collectives.record.patches`), the functional ops
(:mod:`~repro.collectives.record.functional`), the dispatcher's ProcessGroup ops
(:mod:`~repro.collectives.record.native`) - and makes a tracer the active one; :func:`uninstall`
takes them all out again.

Every rank must open its sessions in the same order: the session number prefixes the live
check's store keys. ``install_from_env`` is what a job's process group calls at start-up
(``repro.cluster.process_group.init_distributed``), so ``python -m repro.collectives_trace run``
and ``launch`` can trace a program that never imports the tool.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from repro.collectives.check.checker import Checker, CheckMode
from repro.collectives.record import functional, native, patches
from repro.collectives.record.tracer import Tracer, active, set_active

ENV_DIR = "REPRO_COLLECTIVES_TRACE"
ENV_CHECK = "REPRO_COLLECTIVES_CHECK"
ENV_TIMEOUT = "REPRO_COLLECTIVES_TIMEOUT_S"
ENV_STALL = "REPRO_COLLECTIVES_STALL_S"
"""``run``: seconds a rank's record may stall with a call outstanding before it dumps its Flight
Recorder (default :data:`DEFAULT_STALL_S`; 0: never; ``launch`` sets 0, it watches the ranks)."""
DEFAULT_STALL_S = 30.0
DEFAULT_TIMEOUT_S = 300.0
_sessions = 0


def start(
    out_dir: str | os.PathLike, check: str = "off", timeout_s: float = DEFAULT_TIMEOUT_S
) -> Tracer:
    """Begin tracing in this process (see :func:`trace_collectives`); :func:`stop` ends it."""
    global _sessions
    mode = CheckMode.parse(check)
    # Ranks must agree on the session name (it prefixes the store keys): count sessions per process.
    _sessions += 1
    session = str(_sessions)
    checker = Checker(mode, timeout_s, session) if mode.every else None
    tracer = Tracer(out_dir, checker=checker, session=session)
    install(tracer)
    return tracer


def stop() -> None:
    uninstall()


@contextlib.contextmanager
def trace_collectives(
    out_dir: str | os.PathLike, check: str = "off", timeout_s: float = DEFAULT_TIMEOUT_S
) -> Iterator[Tracer]:
    """Trace every collective of this process into ``out_dir/rank{R}.jsonl`` while the block runs.

    ``check``: ``off`` (record only), ``every`` or ``sample:N``: compare the call across the
    group's ranks before it runs and raise :class:`CollectiveMismatchError` on a difference or
    when a peer does not arrive within ``timeout_s``. All ranks must enter the block in the
    same order.
    """
    tracer = start(out_dir, check, timeout_s)
    try:
        yield tracer
    finally:
        stop()


def install_from_env() -> Tracer | None:
    """Start tracing when ``REPRO_COLLECTIVES_TRACE`` is set; no-op otherwise or when already on."""
    out = os.environ.get(ENV_DIR)
    if not out:
        return None
    if active() is not None:
        patches.patch_deepspeed_backend()
        return active()
    raw_timeout = os.environ.get(ENV_TIMEOUT, str(DEFAULT_TIMEOUT_S))
    try:
        timeout_s = float(raw_timeout)
    except ValueError:
        raise ValueError(f"{ENV_TIMEOUT}={raw_timeout!r} is not a number of seconds") from None
    CheckMode.parse(os.environ.get(ENV_CHECK, "off"), source=ENV_CHECK)
    return start(out, os.environ.get(ENV_CHECK, "off"), timeout_s)


def install(tracer: Tracer) -> None:
    """Make ``tracer`` the active one and install every interception point (idempotent)."""
    current = active()
    if current is not None and current is not tracer:
        raise RuntimeError("another collective trace is already active in this process")
    if not patches.installed:
        patches.patch_torch()
        functional.install(patches.installed)
    native.install()
    patches.patch_deepspeed_backend()
    set_active(tracer)


def uninstall() -> None:
    """Stop tracing and put every original function back."""
    current = active()
    if current is not None:
        current.close()
    set_active(None)
    functional.clear()
    native.uninstall()
    patches.restore()
