"""A rank process's files and what the harness says of it: shared by :mod:`tests.multirank` (fresh ranks) and
:mod:`tests.rank_pool` (warm ones).

Each run gets a directory of its own (:func:`new_run_dir`) with a log, a result, an error, a stack and a ready file a
rank (:func:`rank_paths`); a failed or hung rank is reported by its status, traceback and log tail, each line tagged
``[rank N]`` (:func:`rank_report`), with the Python stacks faulthandler writes on ``SIGUSR1`` (:func:`dump_stacks`);
:func:`kill` ends a rank and whatever it spawned.
"""

from __future__ import annotations

import os
import pathlib
import signal
import time
from typing import Any

LOG_TAIL_LINES = 60
STACK_DUMP_WAIT_S = 3.0


def rank_paths(run_dir: pathlib.Path, rank: int) -> dict[str, pathlib.Path]:
    return {
        "log": run_dir / f"rank{rank}.log",
        "result": run_dir / f"rank{rank}.result.pkl",
        "error": run_dir / f"rank{rank}.error.txt",
        "stack": run_dir / f"rank{rank}.stack.txt",
        "ready": run_dir / f"rank{rank}.ready",
    }


def tag(rank: int, text: str) -> str:
    return "\n".join(f"[rank {rank}] {line}" for line in text.rstrip("\n").splitlines())


def read_text(path: pathlib.Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def mtime_ns(path: pathlib.Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return 0


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def rank_report(rank: int, paths: dict[str, pathlib.Path], status: str) -> str:
    """Tagged status, traceback (when not already in the log tail) and log tail of one rank."""
    log_lines = read_text(paths["log"]).splitlines()
    tail = "\n".join(log_lines[-LOG_TAIL_LINES:])
    parts = [f"[rank {rank}] --- {status}; log: {paths['log']}"]
    if not paths["log"].exists():
        parts.append(
            f"[rank {rank}] (no log: the rank died before the harness bootstrap redirected its output; "
            "look for its stderr in the test's captured output)"
        )
    error = read_text(paths["error"])
    if error and error.strip() not in tail:
        parts.append(tag(rank, error))
    if len(log_lines) > LOG_TAIL_LINES:
        parts.append(f"[rank {rank}] ... ({len(log_lines) - LOG_TAIL_LINES} earlier log lines)")
    if tail:
        parts.append(tag(rank, tail))
    return "\n".join(parts)


def kill(proc: Any) -> None:
    """SIGKILL a rank and its own process group (whatever it spawned), then reap it."""
    if proc.exitcode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # rank has not reached setsid yet, or its group is gone
        try:
            proc.kill()
        except (ProcessLookupError, ValueError):
            pass
    proc.join(timeout=10)


def dump_stacks(procs: list, rank_paths: list[dict[str, pathlib.Path]]) -> dict[int, str]:
    """SIGUSR1 every live rank (faulthandler writes its stacks) and collect what they wrote."""
    live = [r for r, p in enumerate(procs) if p.exitcode is None]
    for r in live:
        try:
            os.kill(procs[r].pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    stacks: dict[int, str] = {}
    deadline = time.monotonic() + STACK_DUMP_WAIT_S
    while live and time.monotonic() < deadline:
        for r in list(live):
            text = read_text(rank_paths[r]["stack"])
            # faulthandler ends a thread's dump with its outermost frame, "<module>" or bootstrap
            if text and ("_rank_main" in text or "<module>" in text):
                time.sleep(0.1)  # let faulthandler finish the other threads
                stacks[r] = read_text(rank_paths[r]["stack"])
                live.remove(r)
        time.sleep(0.05)
    for r in live:
        stacks[r] = read_text(rank_paths[r]["stack"]) or (
            "(no stack: the rank did not answer SIGUSR1; it had probably not reached the harness "
            "bootstrap yet, e.g. still unpickling/importing in its start-up)"
        )
    return stacks


def new_run_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    """A fresh directory per call, so one test can call run_ranks several times."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    i = 0
    while True:
        run_dir = tmp_path / f"multirank{i}"
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            i += 1
