"""One live run per run folder: ``run.lock`` names its holder (pid, host, start time).

Two launches of the same command would otherwise both adopt the unfinished run folder and write
into one log, one ``metrics.tsv`` and one checkpoint folder. :func:`acquire` creates the lock
atomically (a complete file is hard-linked into place, so a reader never sees half of it):

- a lock held by a live process on this host: :class:`RunLocked` (exit 2) naming the holder;
- a stale lock (its process is gone, same host): taken over, and the caller is told so
  (``RunLock.took_over``) to warn;
- a lock of another host: never taken (its process cannot be checked from here); the message says
  which file to remove by hand if that run is known to be dead.

``RunLock.release()`` (or leaving its ``with`` block) removes the lock only while it is still ours.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from repro.run.preflight import InputError

LOCK_FILE = "run.lock"


class RunLocked(InputError):
    """The run folder is held by another live run (or by another host)."""


@dataclass
class Holder:
    pid: int
    host: str
    started: str
    """UTC start time, ISO 8601."""
    token: str
    """Tells this lock from a later one with a reused pid."""

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host} (started {self.started})"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by another user
    return True


def read_holder(path: Path) -> Holder | None:
    """The holder written in lock file ``path``; None when it cannot be read as one."""
    try:
        data = json.loads(path.read_text())
        return Holder(int(data["pid"]), str(data["host"]), str(data["started"]), str(data.get("token", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass
class RunLock:
    path: Path
    holder: Holder
    took_over: Holder | None = None
    """The stale holder this lock replaced, if any (the caller warns about it)."""

    def release(self) -> None:
        """Remove the lock file if it is still this one."""
        current = read_holder(self.path)
        if current is not None and current.token == self.holder.token:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire(run_dir: Path, *, host: str | None = None) -> RunLock:
    """Hold ``run_dir`` for this process (module docstring); :class:`RunLocked` when another run does."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_FILE
    me = Holder(os.getpid(), host or socket.gethostname(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                uuid.uuid4().hex)
    tmp = run_dir / f".{LOCK_FILE}.{me.token}"
    tmp.write_text(json.dumps(asdict(me)) + "\n")
    took_over = None
    try:
        for _ in range(2):
            try:
                os.link(tmp, path)
                return RunLock(path, me, took_over)
            except FileExistsError:
                pass
            other = read_holder(path)
            if other is None:
                raise RunLocked(f"{path} exists but cannot be read as a lock; if no run uses {run_dir}, remove it")
            if other.host != me.host:
                raise RunLocked(
                    f"{run_dir} is in use by {other.describe()}: another host's lock is never taken; if that run "
                    f"is dead, remove {path}, or use another trainer.experiment_name / trainer.output_dir"
                )
            if _pid_alive(other.pid) and other.pid != me.pid:
                raise RunLocked(
                    f"{run_dir} is in use by a live run, {other.describe()}; wait for it or stop it, or use "
                    "another trainer.experiment_name / trainer.output_dir"
                )
            # Stale (its process is gone): take it over, unless someone else just did.
            if read_holder(path) == other:
                path.unlink(missing_ok=True)
                took_over = other
        raise RunLocked(f"{path}: another launch took this run folder at the same moment")
    finally:
        tmp.unlink(missing_ok=True)
