"""A small torchrun-like launcher: N local ranks of a script, tracing on, report when they diverge.

The target is ``SCRIPT [ARGS]`` or, as with ``python -m``, ``-m MODULE [ARGS]``. Each rank runs
``python -m repro.collectives_trace run SCRIPT ARGS`` (or ``run -m MODULE ARGS``) with the usual env://
variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) plus
``REPRO_COLLECTIVES_TRACE``/``REPRO_COLLECTIVES_CHECK``, so the script needs no change. When a
rank fails, the others get ``grace_s`` to fail too (check mode raises on every rank) and are then
killed (a rank stuck in a real collective would wait for the whole process-group timeout).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """What every rank runs: a script file, or a module (``module=True``) as ``python -m`` runs it."""

    name: str
    """Path of the script, or dotted name of the module."""
    args: tuple[str, ...] = ()
    """Its command-line arguments."""
    module: bool = False

    @classmethod
    def parse(cls, tokens: list[str]) -> Target:
        """``SCRIPT [ARGS]`` or ``-m MODULE [ARGS]`` (what follows ``--`` on the launch command line)."""
        if tokens and tokens[0] == "-m":
            if len(tokens) < 2:
                raise ValueError("launch: '-m' needs a MODULE: -- -m MODULE [ARGS]")
            return cls(tokens[1], tuple(tokens[2:]), module=True)
        if not tokens:
            raise ValueError("launch needs a target after '--': SCRIPT [ARGS] or -m MODULE [ARGS]")
        return cls(tokens[0], tuple(tokens[1:]))

    def check(self) -> None:
        """Raise ValueError, before any rank starts, when the script or module does not exist."""
        if not self.module:
            if not pathlib.Path(self.name).is_file():
                raise ValueError(f"SCRIPT {self.name!r} is not a file")
            return
        try:
            found = importlib.util.find_spec(self.name) is not None
        except (ImportError, ValueError):  # a missing parent package, or a relative/empty name
            found = False
        if not found:
            raise ValueError(f"MODULE {self.name!r} (-m) is not importable; is its package on PYTHONPATH?")

    def argv(self) -> list[str]:
        """The target as ``repro.collectives_trace run`` takes it."""
        return ["-m", self.name, *self.args] if self.module else [self.name, *self.args]


def rank_command(target: Target) -> list[str]:
    """The command line of every rank (its env carries the rank and the tracing settings)."""
    return [sys.executable, "-m", "repro.collectives_trace", "run", *target.argv()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    target: Target,
    nproc: int,
    out_dir: pathlib.Path,
    check: str,
    timeout_s: float,
    grace_s: float = 5.0,
) -> list[int]:
    """Run the ranks; return their exit codes (negative: killed by that signal)."""
    if nproc < 1:
        raise ValueError(f"--nproc-per-node must be >= 1, got {nproc}")
    target.check()
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("rank*.jsonl"):
        stale.unlink()
    port = free_port()
    procs = []
    for rank in range(nproc):
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(nproc),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(nproc),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            REPRO_COLLECTIVES_TRACE=str(out_dir),
            REPRO_COLLECTIVES_CHECK=check,
            REPRO_COLLECTIVES_TIMEOUT_S=str(timeout_s),
        )
        log = open(out_dir / f"rank{rank}.log", "w")
        procs.append(
            subprocess.Popen(
                rank_command(target),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        log.close()
    first_failure: float | None = None
    try:
        while any(p.poll() is None for p in procs):
            if first_failure is None and any(p.returncode not in (None, 0) for p in procs):
                first_failure = time.monotonic()
            if first_failure is not None and time.monotonic() - first_failure > grace_s:
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
    return [p.returncode for p in procs]
