"""Warm rank pool: the multi-rank harness with long-lived ranks that run one task after another.

:func:`tests.multirank.run_ranks` spawns fresh ranks per call; importing torch, transformers
and DeepSpeed then costs several seconds per rank on 2 cores, more than most tasks. A
:class:`RankPool` spawns its ranks once (they import torch and DeepSpeed at start-up) and then
takes tasks: ``pool.run(fn, world_size, tmp_path=..., args=...)`` runs
``fn(rank, world_size, *args)`` on ranks ``0..world_size-1`` of the pool, exactly as
``run_ranks`` would, and returns the per-rank results.

Isolation between tasks: every task gets a fresh gloo process group (a new ``FileStore`` in the
task's own run directory), destroyed once every rank is done; then ``repro.cluster.rank_reset`` puts
DeepSpeed's registries and counters, ``os.environ``, torch's dtype, grad mode and threads back
to their state at pool start and collects the task's engines.

Failures are reported as ``run_ranks`` reports them (same :class:`RankFailure` /
:class:`RankTimeout`, same per-rank log files, tracebacks and stacks at timeout), because the
peers of a failed or hung rank may be stuck in a collective: the whole pool is then killed and
respawned for the next task, which therefore never sees a broken rank.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import signal
import time
import traceback
from multiprocessing.connection import wait as wait_for

from tests.multirank import (
    CPU_RANK_ENV,
    RankFailure,
    RankTimeout,
    _die_with_parent,
    _rank_context,
    check_task,
    rank_env,
    run_in_group,
)
from tests.rank_files import (
    describe_exit,
    dump_stacks,
    kill,
    mtime_ns,
    new_run_dir,
    rank_paths,
    rank_report,
    tag,
)

__all__ = ["RankPool"]

_STOP = "stop"


def _run_task(conn, task: tuple, rank: int, snapshot) -> None:
    """One task on this rank; answers ``("ok"|"error", rank)`` on ``conn``."""
    import faulthandler
    import sys


    payload, world_size, run_dir, env, deepspeed, timeout_s = task
    paths = rank_paths(pathlib.Path(run_dir), rank)
    log = open(paths["log"], "a", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    faulthandler.enable(file=log, all_threads=True)
    stack_file = open(paths["stack"], "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    os.environ.update(rank_env(rank, world_size))
    os.environ.update(env)
    try:
        run_in_group(payload, rank, world_size, run_dir, "gloo", deepspeed, timeout_s, paths["result"])
        snapshot.restore()
        answer = "ok"
    except BaseException:  # noqa: B036 - SystemExit/KeyboardInterrupt in fn are failures too
        text = traceback.format_exc()
        paths["error"].write_text(text)
        sys.stderr.write(text)
        answer = "error"
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    faulthandler.unregister(signal.SIGUSR1)
    stack_file.close()
    log.close()
    conn.send((answer, rank))


def _pool_rank_main(conn, rank: int, parent_env: dict[str, str]) -> None:
    """Entry point of one pool rank: import the heavy libraries once, then serve tasks.
    ``parent_env`` is the test process's environment at the pool's start (not the forkserver's)."""
    os.setsid()
    _die_with_parent()
    os.environ.clear()
    os.environ.update({**parent_env, **rank_env(rank, 1), **CPU_RANK_ENV})
    import torch

    from repro.cluster.process_group import disable_deepspeed_shm_op

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    disable_deepspeed_shm_op()
    import deepspeed  # noqa: F401 - warm import, the point of the pool
    import transformers  # noqa: F401

    from repro.cluster.rank_reset import ProcessSnapshot

    snapshot = ProcessSnapshot()
    conn.send(("ready", rank))
    while True:
        task = conn.recv()
        if task == _STOP:
            os._exit(0)
        _run_task(conn, task, rank, snapshot)


class RankPool:
    """``size`` warm gloo ranks that run tasks of up to ``size`` ranks, one task at a time."""

    def __init__(self, size: int = 2, start_timeout_s: float = 120.0) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size, self.start_timeout_s = size, start_timeout_s
        self.tasks_run = 0
        self.spawns = 0
        self._procs: list = []
        self._conns: list = []

    # ---- life cycle ----------------------------------------------------------------------------

    def _start(self) -> None:
        ctx = _rank_context()
        self._procs, self._conns = [], []
        for r in range(self.size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_pool_rank_main, args=(child, r, dict(os.environ)), name=f"rankpool-rank{r}",
                               daemon=True)
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
        self.spawns += 1
        deadline = time.monotonic() + self.start_timeout_s
        for r, conn in enumerate(self._conns):
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                self.close()
                raise RankTimeout(f"rank pool: rank {r} not ready after {self.start_timeout_s:g} s")
            try:
                conn.recv()
            except EOFError:
                code = self._procs[r].exitcode
                self.close()
                raise RankFailure(f"rank pool: rank {r} {describe_exit(code)} during start-up") from None

    def close(self) -> None:
        """Stop every rank (a stop message, then SIGKILL for any that does not exit)."""
        for conn in self._conns:
            try:
                conn.send(_STOP)
            except (OSError, ValueError):
                pass
        for proc in self._procs:
            proc.join(timeout=2)
            kill(proc)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- tasks ---------------------------------------------------------------------------------

    def run(self, fn, world_size: int = 2, *, tmp_path: pathlib.Path, timeout_s: float = 60.0, args: tuple = (),
            env: dict[str, str] | None = None, deepspeed: bool = True) -> list:
        """Run ``fn(rank, world_size, *args)`` on pool ranks ``0..world_size-1``; results indexed by rank.

        Same contract as :func:`tests.multirank.run_ranks` (gloo only); ``timeout_s`` bounds the
        task, not the pool's start-up. ``world_size`` may not exceed the pool's size.
        """
        if not 1 <= world_size <= self.size:
            raise ValueError(f"world_size must be in 1..{self.size} (the pool's size), got {world_size}")
        payload = check_task(fn, args, timeout_s)
        if not self._procs:
            self._start()
        run_dir = new_run_dir(pathlib.Path(tmp_path))
        task = (payload, world_size, str(run_dir), {str(k): str(v) for k, v in (env or {}).items()},
                deepspeed, float(timeout_s))
        procs, conns = self._procs[:world_size], self._conns[:world_size]
        paths = [rank_paths(run_dir, r) for r in range(world_size)]
        start = time.monotonic()
        for conn in conns:
            conn.send(task)
        answers: dict[int, str] = {}
        try:
            failed = self._wait(procs, conns, paths, answers, start + timeout_s)
        except BaseException:
            self.close()
            raise
        elapsed = time.monotonic() - start
        name = f"{fn.__module__}.{fn.__qualname__}"
        if failed is None and len(answers) == world_size:
            self.tasks_run += 1
            results = []
            for p in paths:
                with open(p["result"], "rb") as f:
                    results.append(pickle.load(f))
            return results
        if failed is not None:
            statuses = {r: ("raised (traceback below)" if answers.get(r) == "error" else
                            "finished" if answers.get(r) == "ok" else
                            describe_exit(procs[r].exitcode) if procs[r].exitcode is not None else
                            f"still running when rank {failed} failed; killed by the harness")
                        for r in range(world_size)}
            reports = [rank_report(r, paths[r], statuses[r]) for r in range(world_size)]
            self.close()
            raise RankFailure(f"rank {failed} {statuses[failed]} after {elapsed:.1f} s ({world_size} ranks of a "
                              f"rank pool, fn={name}, dir={run_dir})\n" + "\n".join(reports))
        hung = [r for r in range(world_size) if r not in answers]
        stacks = dump_stacks([procs[r] if r in hung else _Finished() for r in range(world_size)], paths)
        sections = []
        for r in range(world_size):
            section = rank_report(r, paths[r], "hung; stack at timeout below" if r in hung else "finished")
            if r in hung:
                section += f"\n[rank {r}] --- Python stack at timeout:\n" + tag(r, stacks[r])
            sections.append(section)
        self.close()
        raise RankTimeout(f"ranks {hung} still running after timeout_s={timeout_s:g} s; killed ({world_size} ranks "
                          f"of a rank pool, fn={name}, dir={run_dir})\n" + "\n".join(sections))

    def _wait(self, procs, conns, paths, answers: dict[int, str], deadline: float) -> int | None:
        """Collect answers until all ranks are done, one fails (its rank returned) or the deadline."""
        while len(answers) < len(conns):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready = wait_for([c for r, c in enumerate(conns) if r not in answers]
                             + [p.sentinel for r, p in enumerate(procs) if r not in answers], timeout=min(remaining, 1.0))
            bad = []
            for r, conn in enumerate(conns):
                if r in answers or conn not in ready and procs[r].sentinel not in ready:
                    continue
                try:
                    answer, _ = conn.recv()
                except (EOFError, OSError):
                    procs[r].join(timeout=1)
                    answer = "died"
                answers[r] = answer
                if answer != "ok":
                    bad.append(r)
            if bad:
                # A peer's gloo error may follow the real failure: blame the log that went quiet first.
                return min(bad, key=lambda r: mtime_ns(paths[r]["log"]))
        return None


class _Finished:
    """Stands in for a rank that answered, so that ``dump_stacks`` leaves it alone."""

    exitcode = 0
    pid = None
