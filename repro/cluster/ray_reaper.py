"""Ray processes a killed driver left behind: found through their session folder, and ended.

A local Ray instance (``ray.init(address="local")``) ends with its driver on every path but one:
after ``kill -9`` of the driver, Ray 2.60's ``DashboardAgent`` and ``RuntimeEnvAgent`` (about
190 MB together) outlive it, re-parented to init, and nothing of Ray ever ends them. Their
command line and environment are no help (``setproctitle`` overwrites both), but they keep their
log files open in the session folder. So right after a local ``ray.init`` the driver writes
``repro_owner.json`` (its pid and start time) into that folder; a process with a file open in a
session folder whose owner is gone (no such pid, a zombie, or a pid reused by a later process)
is an orphan.

:func:`reap_orphans` runs before every local ``ray.init`` (:func:`init_ray`, called by
``repro.cluster.worker_group``), and ``python -m repro.cluster.ray_reaper`` runs it by hand.
Sessions without the owner file (another tool's, a cluster joined through
``trainer.ray_address``) and the sessions of live drivers are never touched.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

import psutil

OWNER_FILE = "repro_owner.json"
# Ray's agents ignore SIGTERM once their raylet is gone: they get SIGKILL after this grace.
_TERM_GRACE_S = 2.0


def _start_time(proc: psutil.Process) -> float:
    return round(proc.create_time(), 2)


def mark_session(session_dir: str | Path) -> None:
    """Record this process as the owner of the Ray session in ``session_dir``."""
    me = psutil.Process()
    (Path(session_dir) / OWNER_FILE).write_text(json.dumps({"pid": me.pid, "started": _start_time(me)}))


def _owner_alive(owner: dict[str, Any]) -> bool:
    try:
        proc = psutil.Process(int(owner["pid"]))
        # A driver killed by -9 whose parent has not waited for it yet is a zombie: gone all the same.
        return _start_time(proc) == owner["started"] and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def _session_of(path: str) -> Path | None:
    for parent in Path(path).parents:
        if parent.name.startswith("session_"):
            return parent
    return None


def orphans() -> list[psutil.Process]:
    """Processes with a file open in a repro-owned Ray session whose owner is gone."""
    dead: dict[Path, bool] = {}
    found = []
    for proc in psutil.process_iter():
        try:
            sessions = {s for f in proc.open_files() if (s := _session_of(f.path)) is not None}
        except psutil.Error:
            continue
        for session in sessions:
            if session not in dead:
                owner_file = session / OWNER_FILE
                try:
                    dead[session] = not _owner_alive(json.loads(owner_file.read_text()))
                except (OSError, ValueError):
                    dead[session] = False  # not a repro session, or not marked yet: leave it be
            if dead[session]:
                found.append(proc)
                break
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
    and marks its own session (module docstring)."""
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
            "ended %d Ray process(es) left by an earlier run that was killed: %s", len(ended), "; ".join(ended))
    ray.init(**kwargs)
    mark_session(ray._private.worker._global_node.get_session_dir_path())


def main() -> int:
    ended = reap_orphans()
    for line in ended:
        print(f"ended {line}")
    print(f"{len(ended)} Ray process(es) of killed repro drivers ended")
    return 0


if __name__ == "__main__":
    sys.exit(main())
