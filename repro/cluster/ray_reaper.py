"""Ray processes a killed driver left behind: found by their owner's mark, and ended.

A local Ray instance (``ray.init(address="local")``) ends with its driver on every path but one:
after ``kill -9`` of the driver, Ray 2.60's ``DashboardAgent`` and ``RuntimeEnvAgent`` (about
190 MB together) outlive it, re-parented to init, and nothing of Ray ever ends them. So the
driver marks the processes its ``ray.init`` starts: :func:`owner_mark` puts ``REPRO_RAY_OWNER=
<pid>:<start time>`` into the environment they inherit (and takes it out again after). A marked
process whose owner is gone (no such pid, or a pid reused by a later process) is an orphan.

:func:`reap_orphans` runs before every local ``ray.init`` (``repro.cluster.worker_group``), and
``python -m repro.cluster.ray_reaper`` runs it by hand. Another user's live run, a cluster joined
through ``trainer.ray_address`` and any process without the mark are never touched: only the
caller's own uid's processes are readable anyway.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import psutil

OWNER_ENV = "REPRO_RAY_OWNER"
# Ray's agents ignore SIGTERM once their raylet is gone: they get SIGKILL after this grace.
_TERM_GRACE_S = 2.0


def _mark_of(proc: psutil.Process) -> str:
    return f"{proc.pid}:{proc.create_time():.3f}"


@contextlib.contextmanager
def owner_mark() -> Iterator[str]:
    """Within the block, processes started from here carry this process's owner mark."""
    mark = _mark_of(psutil.Process())
    previous = os.environ.get(OWNER_ENV)
    os.environ[OWNER_ENV] = mark
    try:
        yield mark
    finally:
        # Only what ray.init starts needs it; later children (a benchmark's runs) are not Ray's.
        if previous is None:
            os.environ.pop(OWNER_ENV, None)
        else:
            os.environ[OWNER_ENV] = previous


def _owner_alive(mark: str) -> bool:
    pid, _, started = mark.partition(":")
    try:
        owner = psutil.Process(int(pid))
        # A driver killed by -9 whose parent has not waited for it yet is a zombie: gone all the same.
        return _mark_of(owner) == f"{pid}:{started}" and owner.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, ValueError):
        return False


def orphans() -> list[psutil.Process]:
    """Marked processes whose owner is gone (a zombie owner counts as gone)."""
    me = os.getpid()
    found = []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            mark = proc.environ().get(OWNER_ENV)
            if mark and not _owner_alive(mark) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def reap_orphans() -> list[str]:
    """End the orphans (SIGTERM, then SIGKILL); returns a line per process ended."""
    procs = orphans()
    ended = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            ended.append(f"{proc.pid} {proc.name()} ({proc.memory_info().rss / 2**20:.0f} MB)")
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=_TERM_GRACE_S)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=_TERM_GRACE_S)
    return ended


class _DropTokenNotice(logging.Filter):
    """Ray 2.60 warns on every local start that it turned token authentication on by default;
    repro's local instance keeps that default, so the line says nothing to act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


def init_ray(kwargs: dict[str, Any], *, local: bool) -> None:
    """``ray.init(**kwargs)``; a local instance first ends the orphans of earlier killed drivers
    and marks its own processes (module docstring)."""
    import ray

    token_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _DropTokenNotice) for f in token_log.filters):
        token_log.addFilter(_DropTokenNotice())
    if not local:
        ray.init(**kwargs)
        return
    ended = reap_orphans()
    if ended:
        logging.getLogger("repro.trainer").warning(
            "ended %d Ray process(es) left by a killed earlier run: %s", len(ended), "; ".join(ended))
    with owner_mark():
        ray.init(**kwargs)


def main() -> int:
    started = time.monotonic()
    ended = reap_orphans()
    for line in ended:
        print(f"ended {line}")
    print(f"{len(ended)} Ray process(es) of dead repro drivers ended ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
