"""Multi-rank test harness: run a function on N fresh ranks joined in a real process group.

Every distributed test goes through :func:`run_ranks`. Each rank is a fresh process forked from
a ``forkserver`` that imported torch once for the whole pytest process (about 1.2 CPU s a rank
saved against ``spawn``; the server holds no threads, no pytest state and no CUDA context, so
the fork is clean). A rank starts in :func:`_rank_main` (not in pytest's state): it redirects
its stdout/stderr to a per-rank log file, sets the rank environment, creates the default process
group (gloo on CPU, or NCCL with one CUDA device per rank) with a ``FileStore`` inside the
test's tmp dir (no ports, so parallel pytest workers never clash), optionally hands that group
to DeepSpeed, runs ``fn(rank, world_size, *args)`` and pickles the result to a file.

The parent watches all ranks at once. The first rank that raises, exits non-zero or dies by a
signal fails the run: its peers are killed at once and :class:`RankFailure` carries every
rank's output, each line tagged ``[rank N]``. A run that outlives ``timeout_s`` has the Python
stacks of its live ranks dumped (faulthandler on ``SIGUSR1``) before they are killed, and
raises :class:`RankTimeout`; only that test fails. :mod:`tests.rank_pool` runs the same tasks
on warm ranks that take one task after another; both keep a rank's files and their reports in
:mod:`tests.rank_files`.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import signal
import time
import traceback
from collections.abc import Callable
from multiprocessing import get_context
from multiprocessing.connection import wait as wait_for_sentinels
from typing import Any

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

__all__ = ["RankFailure", "RankTimeout", "check_task", "run_ranks"]

# gloo must not give up on a collective before the harness does: the harness reports hangs
# with stacks, a gloo timeout would only say "timed out".
_GLOO_TIMEOUT_MARGIN_S = 120.0
# Spawn, imports (torch, DeepSpeed, transformers) and the process group of fresh ranks: seconds on
# a quiet machine, much more with both xdist workers and their ranks on 2 cores.
START_TIMEOUT_S = 180.0
# How long a failed rank's peers get for their own exit statuses to arrive (see run_ranks).
_STATUS_GRACE_S = 1.0
BACKENDS = ("gloo", "nccl")
# NVLink multicast (NVLS) must stay off on the lent GPU machines (docs/running.md, the GPU gate); set in every
# NCCL rank so that a run never depends on the caller's environment for it.
_NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


class RankFailure(AssertionError):
    """A rank raised, exited non-zero or died by a signal; the message holds every rank's output."""


class RankTimeout(RankFailure):
    """Ranks were still running after ``timeout_s``; the message names them and shows their stacks."""


def _rank_context():
    """The start method of fresh ranks: one forkserver per test process, torch imported once."""
    ctx = get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "tests.multirank"])
    return ctx


# A gloo rank runs on the CPU and must not see a GPU the host may have: torch state of a GPU it does not
# use leaks into CPU runs (on the GPU machine's CPU suite, torch.compile inside a checkpointed layer
# initialised CUDA, and torch.utils.checkpoint refused the forward).
CPU_RANK_ENV = {"DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": ""}


def rank_env(rank: int, world_size: int) -> dict[str, str]:
    """The environment torch.distributed and DeepSpeed read in rank ``rank`` of a one-host job."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1"}


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this rank if the pytest process dies, so no rank outlives its test."""
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the parent's finally-block kill still applies


def _rank_main(
    payload: bytes,
    rank: int,
    world_size: int,
    run_dir: str,
    env: dict[str, str],
    deepspeed: bool,
    timeout_s: float,
    backend: str = "gloo",
    parent_env: dict[str, str] | None = None,
) -> None:
    """Entry point of one rank. Sets the environment before importing anything that reads it
    (DeepSpeed, the test module); torch, already imported, gets its thread count set explicitly.
    ``parent_env`` is the test process's environment when the ranks started (a forked rank
    would otherwise see the forkserver's, from when the server started)."""
    # Own process group: the parent can kill this rank together with anything it started.
    os.setsid()
    _die_with_parent()
    paths = rank_paths(pathlib.Path(run_dir), rank)

    import faulthandler
    import sys

    log = open(paths["log"], "a", buffering=1)
    # dup2 so output written by C/C++ code (gloo, DeepSpeed ops) lands in the log too.
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.reconfigure(write_through=True)
    # Fatal signals (SIGSEGV, SIGABRT, ...) print the Python stack into the log before dying.
    faulthandler.enable(file=log, all_threads=True)
    stack_file = open(paths["stack"], "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)

    if parent_env is not None:
        os.environ.clear()
        os.environ.update(parent_env)
    os.environ.update(rank_env(rank, world_size))
    if backend == "nccl":
        # The root conftest sets DS_ACCELERATOR=cpu for CPU suites; NCCL ranks run DeepSpeed on
        # CUDA (repro.devices.on_cpu() is then False). CUDA_VISIBLE_DEVICES is left as given.
        os.environ["DS_ACCELERATOR"] = "cuda"
        os.environ.update(_NCCL_ENV)
    else:
        os.environ.update(CPU_RANK_ENV)
    os.environ.update(env)

    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    try:
        run_in_group(payload, rank, world_size, run_dir, backend, deepspeed, timeout_s, paths["result"])
        # The result is on disk: leave without interpreter finalisation, whose C++ static
        # destructors now and then abort a finished rank (see exit_rank_process).
        from repro.cluster.process_group import exit_rank_process

        log.flush()
        exit_rank_process(0)
    except BaseException:  # noqa: B036 - SystemExit/KeyboardInterrupt in fn are failures too
        text = traceback.format_exc()
        paths["error"].write_text(text)
        sys.stderr.write(text)
        sys.stderr.flush()
        # Skip atexit/teardown: peers may be stuck in a collective and the parent kills them anyway.
        os._exit(1)


def run_in_group(payload: bytes, rank: int, world_size: int, run_dir: str, backend: str, deepspeed: bool,
                 timeout_s: float, result_path: pathlib.Path) -> None:
    """One rank's task (``run_ranks`` and the rank pool): a fresh group, ``fn``, its result on disk."""
    import datetime

    import torch
    import torch.distributed as dist

    wait = datetime.timedelta(seconds=timeout_s + _GLOO_TIMEOUT_MARGIN_S)
    # Unpickled only now, so the test module (and torch/DeepSpeed it imports) sees the env.
    fn, args = pickle.loads(payload)
    store = dist.FileStore(str(pathlib.Path(run_dir) / "filestore"), world_size)
    if backend == "nccl":
        # LOCAL_RANK == rank: one host, one visible device per rank.
        torch.cuda.set_device(rank)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=wait)
    if deepspeed:
        from repro.cluster.process_group import init_distributed

        init_distributed()
    # run_ranks starts the task's clock here: start-up (spawn, imports, group) has a limit of its own.
    rank_paths(pathlib.Path(run_dir), rank)["ready"].touch()
    result = fn(rank, world_size, *args)
    tmp = result_path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(result, f)
    os.replace(tmp, result_path)
    # Tear down only once every rank is done: a rank that destroys its gloo group while a peer is
    # still in a collective or a store check can abort; the rendezvous is the store's, not a collective.
    store.set(f"multirank_done/{rank}", "1")
    store.wait([f"multirank_done/{r}" for r in range(world_size)], wait)
    dist.destroy_process_group()


def check_task(fn: Callable[..., Any], args: tuple, timeout_s: float) -> bytes:
    """The pickled ``(fn, args)`` of a task, or ValueError when ranks could not run it."""
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if getattr(fn, "__qualname__", "").count("<locals>") or getattr(fn, "__name__", "") == "<lambda>":
        raise ValueError(f"fn must be a module-level function (spawned ranks import it by name), got {fn!r}")
    try:
        return pickle.dumps((fn, tuple(args)))
    except Exception as exc:
        raise ValueError(f"fn and args must be picklable to reach the spawned ranks: {exc}") from exc


def run_ranks(
    fn: Callable[..., Any],
    world_size: int = 2,
    *,
    tmp_path: pathlib.Path,
    timeout_s: float = 60.0,
    args: tuple = (),
    env: dict[str, str] | None = None,
    deepspeed: bool = True,
    backend: str = "gloo",
) -> list:
    """Run fn(rank, world_size, *args) on `world_size` spawned processes; return per-rank results (list indexed by rank).

    ``fn`` must be a module-level function; it and ``args`` are pickled, and each rank's return
    value is pickled back. ``timeout_s`` bounds ``fn`` itself, from the moment every rank has
    its process group (and DeepSpeed); start-up (spawn, imports, group) has its own limit of
    ``START_TIMEOUT_S``, so a short ``timeout_s`` means the same on a loaded machine. ``env`` is applied after the harness's own variables, so
    it may override them. With ``deepspeed=True`` each rank also calls
    ``repro.cluster.process_group.init_distributed()`` on the harness's group. Rank logs, results and the
    FileStore live in a fresh ``tmp_path/multirank<i>`` directory.

    ``backend="gloo"`` (default) runs on CPU with ``DS_ACCELERATOR=cpu``. ``backend="nccl"``
    gives rank r CUDA device r (``torch.cuda.set_device``), ``DS_ACCELERATOR=cuda`` and NVLink
    multicast off (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
    ``NVSHMEM_DISABLE_NVLS=1``); it needs ``world_size`` visible CUDA devices.

    Raises RankFailure on the first rank that raises, exits non-zero or dies by a signal (peers
    are killed), RankTimeout when ranks are still running after ``timeout_s``, and ValueError
    for an unusable ``fn``/``args``/``world_size``/``timeout_s``/``backend``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not supported; choose one of {list(BACKENDS)}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    payload = check_task(fn, args, timeout_s)
    env = {str(k): str(v) for k, v in (env or {}).items()}

    run_dir = new_run_dir(pathlib.Path(tmp_path))
    files = [rank_paths(run_dir, r) for r in range(world_size)]
    ctx = _rank_context()
    procs = [
        ctx.Process(target=_rank_main, name=f"multirank-rank{r}", daemon=True,
                    args=(payload, r, world_size, str(run_dir), env, deepspeed, float(timeout_s), backend,
                          dict(os.environ)))
        for r in range(world_size)
    ]
    start = time.monotonic()
    ready_at: float | None = None
    try:
        for p in procs:
            p.start()
        failed: int | None = None
        grace_waited = False
        while True:
            running = [p for p in procs if p.exitcode is None]
            bad = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            # An exit 0 without a result file means fn bypassed the bootstrap (os._exit(0), ...).
            silent = [
                r for r, p in enumerate(procs) if p.exitcode == 0 and not files[r]["result"].exists()
            ]
            if (bad or silent) and running and not grace_waited:
                # A forkserver child's exit status reaches us through the server, a moment after
                # its peers may have seen it die: let the statuses of ranks that already died
                # arrive before choosing whom to blame.
                grace_waited = True
                until = time.monotonic() + _STATUS_GRACE_S
                while running and time.monotonic() < until:
                    wait_for_sentinels([p.sentinel for p in running], timeout=until - time.monotonic())
                    running = [p for p in running if p.exitcode is None]
                continue
            if bad or silent:
                # Several ranks may be dead by the time we look (a peer's gloo error follows the
                # real failure): blame one killed by a signal first (its peers only exit on the
                # error it causes), then the one whose log went quiet first. Log times alone can
                # tie: mtimes move in clock ticks of a few ms, and a peer's error can come that fast.
                failed = min(bad + silent, key=lambda r: (not (procs[r].exitcode or 0) < 0,
                                                          mtime_ns(files[r]["log"])))
                break
            if not running:
                break
            now = time.monotonic()
            if ready_at is None and all(paths["ready"].exists() for paths in files):
                ready_at = now
            remaining = (ready_at + timeout_s if ready_at is not None else start + START_TIMEOUT_S) - now
            if remaining <= 0:
                break
            # Short polls until every rank is ready, so the task's clock starts on time.
            wait_for_sentinels([p.sentinel for p in running], timeout=min(remaining, 1.0 if ready_at else 0.1))
        elapsed = time.monotonic() - start

        if failed is not None:
            statuses = {r: describe_exit(p.exitcode) for r, p in enumerate(procs)}
            if procs[failed].exitcode == 0:
                statuses[failed] = "exited with code 0 without returning a result"
            for r, p in enumerate(procs):
                if p.exitcode is None:
                    kill(p)
                    statuses[r] = f"still running when rank {failed} failed; killed by the harness"
            reports = [rank_report(r, files[r], statuses[r]) for r in range(world_size)]
            raise RankFailure(
                f"rank {failed} {statuses[failed]} after {elapsed:.1f} s "
                f"({world_size} ranks, fn={fn.__module__}.{fn.__qualname__}, dir={run_dir})\n"
                + "\n".join(reports)
            )

        hung = [r for r, p in enumerate(procs) if p.exitcode is None]
        if hung:
            stacks = dump_stacks(procs, files)
            for p in procs:
                kill(p)
            sections = []
            for r in range(world_size):
                status = "hung; stack at timeout below" if r in hung else describe_exit(procs[r].exitcode)
                section = rank_report(r, files[r], status)
                if r in hung:
                    section += f"\n[rank {r}] --- Python stack at timeout:\n" + tag(r, stacks[r])
                sections.append(section)
            when = (f"still running after timeout_s={timeout_s:g} s (start-up took {ready_at - start:.1f} s)"
                    if ready_at is not None else f"still starting after START_TIMEOUT_S={START_TIMEOUT_S:g} s")
            raise RankTimeout(
                f"ranks {hung} {when}; killed "
                f"({world_size} ranks, fn={fn.__module__}.{fn.__qualname__}, dir={run_dir})\n"
                + "\n".join(sections)
            )

        results = []
        for r in range(world_size):
            with open(files[r]["result"], "rb") as f:
                results.append(pickle.load(f))
        return results
    finally:
        # Also on KeyboardInterrupt or an error above: no rank may outlive its test.
        for p in procs:
            if p.pid is not None:
                kill(p)
