"""A small torchrun-like launcher: N local ranks of a script, tracing on, report when they diverge.

The target is ``SCRIPT [ARGS]`` or, as with ``python -m``, ``-m MODULE [ARGS]``. Each rank runs
``python -m repro.collectives_trace run SCRIPT ARGS`` (or ``run -m MODULE ARGS``) with the usual env://
variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) plus
``REPRO_COLLECTIVES_TRACE``/``REPRO_COLLECTIVES_CHECK``, so the script needs no change. When a
rank fails, the others get ``grace_s`` to fail too (check mode raises on every rank) and are then
killed (a rank stuck in a real collective would wait for the whole process-group timeout).

The launcher also turns a hang into a report (see :mod:`repro.collectives.launch.stall`): when no live
rank's record grew for ``stall_s`` while a traced call is outstanding, every rank dumps its Python
stacks (faulthandler on ``SIGUSR1``, into its log) and is killed. SIGTERM and Ctrl-C to the
launcher end every rank the same way, and the caller still analyses what was recorded.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import random
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from repro.collectives.launch.stall import STACK_SIGNAL, ProgressWatch, request_dumps

_STACK_DUMP_WAIT_S = 1.5


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


@dataclass
class LaunchResult:
    """How the ranks ended."""

    codes: list[int]
    """Exit codes by rank (negative: killed by that signal)."""
    interrupted: int | None = None
    """The signal (SIGINT, SIGTERM) that stopped the launcher, if one did."""
    stalled_s: float | None = None
    """Set when the job was ended as hung: seconds without progress on any live rank."""
    killed: set[int] = field(default_factory=set)
    """Ranks the launcher killed (they did not fail on their own)."""
    stacks: dict[int, str] = field(default_factory=dict)
    """Python stacks each live rank dumped before it was killed (hang or interrupt)."""


def rank_command(target: Target) -> list[str]:
    """The command line of every rank (its env carries the rank and the tracing settings)."""
    return [sys.executable, "-m", "repro.collectives_trace", "run", *target.argv()]


# Ray's workers bind 10002-19999 by default; ports from here up to the ephemeral range are taken
# only by an explicit bind such as a rendezvous's.
_PORT_FLOOR = 20000
_PORT_RANGE_FILE = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(_PORT_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default range starts here


def free_port(host: str = "127.0.0.1") -> int:
    """A port for rank 0's rendezvous store that was free a moment ago, drawn below the ephemeral range.

    Why not ``bind(0)``: the OS answers from the ephemeral range, the range every outgoing connection
    on the machine takes its local port from (Ray, gloo and TCPStore clients connect all the time),
    and the port is free again between this call and rank 0's bind. A CI run lost rank 0 to
    EADDRINUSE that way (port 38557). Below that range only another explicit bind can take it, and a
    random draw makes two launchers starting together unlikely to pick the same one.
    """
    low = _ephemeral_low()
    draw = random.SystemRandom()
    for _ in range(64):
        port = draw.randrange(_PORT_FLOOR, low) if low - _PORT_FLOOR >= 1024 else 0
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue  # held, or in TIME_WAIT: a store bound there now could fail the same way
            return s.getsockname()[1]
    raise RuntimeError(f"no free port found on {host} between {_PORT_FLOOR} and {low} in 64 draws")


def prepare_out_dir(out_dir: pathlib.Path) -> None:
    """Create ``--out`` (a directory) and clear old records; ValueError with one line when it cannot be."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {str(out_dir)!r} is an existing file; give a directory (created if missing)")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / ".write_probe"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ValueError(f"--out {str(out_dir)!r} is not a writable directory: {exc.strerror}") from None
    for stale in [*out_dir.glob("rank*.jsonl"), *out_dir.glob("rank*.log"), *out_dir.glob("fr_trace_rank_*")]:
        stale.unlink()


def _start_ranks(target: Target, nproc: int, out_dir: pathlib.Path, check: str, timeout_s: float) -> list:
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
            # this launcher watches for hangs and asks for the Flight Recorder dumps itself
            REPRO_COLLECTIVES_STALL_S="0",
        )
        with open(out_dir / f"rank{rank}.log", "w") as log:
            # Own session: a Ctrl-C in the terminal reaches the launcher only, which ends the
            # ranks itself after collecting their stacks.
            procs.append(
                subprocess.Popen(
                    rank_command(target),
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    return procs


def _dump_stacks(procs: list, out_dir: pathlib.Path) -> dict[int, str]:
    """Ask every live rank for its Python stacks (faulthandler, into its log) and return them."""
    request_dumps(out_dir)
    offsets = {}
    for rank, p in enumerate(procs):
        if p.poll() is None:
            log = out_dir / f"rank{rank}.log"
            offsets[rank] = log.stat().st_size if log.exists() else 0
            try:
                os.kill(p.pid, STACK_SIGNAL)
            except ProcessLookupError:
                pass
    if not offsets:
        return {}
    time.sleep(_STACK_DUMP_WAIT_S)
    stacks = {}
    for rank, offset in offsets.items():
        with open(out_dir / f"rank{rank}.log", "rb") as f:
            f.seek(offset)
            stacks[rank] = f.read().decode(errors="replace")
    return stacks


def launch(
    target: Target,
    nproc: int,
    out_dir: pathlib.Path,
    check: str,
    timeout_s: float,
    grace_s: float = 5.0,
    stall_s: float = 30.0,
) -> LaunchResult:
    """Run the ranks until they end, fail, hang for ``stall_s`` (0: never) or the launcher is signalled."""
    if nproc < 1:
        raise ValueError(f"--nproc-per-node must be >= 1, got {nproc}")
    if stall_s < 0:
        raise ValueError(f"--stall-s must be >= 0 (0 turns the hang watch off), got {stall_s}")
    target.check()
    prepare_out_dir(out_dir)
    result = LaunchResult(codes=[])
    caught: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        caught.append(signum)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    procs = _start_ranks(target, nproc, out_dir, check, timeout_s)
    watch = ProgressWatch(out_dir, stall_s)
    first_failure: float | None = None
    try:
        while any(p.poll() is None for p in procs):
            if caught:
                result.interrupted = caught[0]
                break
            if first_failure is None and any(p.returncode not in (None, 0) for p in procs):
                first_failure = time.monotonic()
            if first_failure is not None and time.monotonic() - first_failure > grace_s:
                result.stacks = _dump_stacks(procs, out_dir)
                break
            live = [r for r, p in enumerate(procs) if p.poll() is None]
            if watch.stalled(live, finished=len(live) < len(procs)):
                result.stalled_s = watch.idle_s()
                break
            time.sleep(0.05)
        if result.interrupted is not None or result.stalled_s is not None:
            result.stacks = _dump_stacks(procs, out_dir)
    finally:
        # Every live rank is killed before any is waited for: killed and reaped one by one, a rank
        # could see its killed peer's connection close and raise before its own kill arrived, and its
        # traceback would then lead the report of a hang (seen once its Flight Recorder dump no
        # longer spent ~2 s importing inductor: stall.py's _no_inductor_import).
        for rank, p in enumerate(procs):
            if p.poll() is None:
                result.killed.add(rank)
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in procs:
            p.wait()
        for s, handler in previous.items():
            signal.signal(s, handler)
    result.codes = [p.returncode for p in procs]
    return result


def log_tail(out_dir: pathlib.Path, rank: int, lines: int = 25) -> str:
    """The last lines of a rank's log (its own traceback when it died on its own)."""
    path = out_dir / f"rank{rank}.log"
    if not path.exists():
        return ""
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


_TRACEBACK = "Traceback (most recent call last):"
_PREFIX = re.compile(r"^\[rank\d+\]: ", re.MULTILINE)  # torch's per-rank prefix on stderr lines
_NOT_TRACEBACK = ("Current thread 0x", "Thread 0x", "Fatal Python error")
# The entry point and the command line that ``run`` goes through (repro/collectives/cli.py).
_TOOL_FRAME = re.compile(r'collectives_trace\.py"|[/\\]collectives[/\\]cli\.py"')


def own_exception(out_dir: pathlib.Path, rank: int, lines: int = 40) -> str | None:
    """The last Python traceback in a rank's log, unless it is the trace's own mismatch report.

    A rank that raised by itself (a bad batch, a typo) is the story of the job: its peers then
    wait for it in a collective, and what the trace says about them is a consequence.
    """
    path = out_dir / f"rank{rank}.log"
    if not path.exists():
        return None
    text = path.read_text(errors="replace")
    at = text.rfind(_TRACEBACK)
    if at < 0:
        return None
    block: list[str] = []
    for line in _PREFIX.sub("", text[at:]).splitlines():
        if line.startswith(_NOT_TRACEBACK):
            break  # what follows (faulthandler's dump of the stacks) is not the exception
        block.append(line)
    if any("CollectiveMismatchError" in line for line in block):
        return None
    # The launcher's own frames (runpy, the trace tool's ``run``) say nothing about the job.
    kept: list[str] = []
    skipping = False
    for line in block:
        if line.startswith("  File "):
            skipping = "<frozen runpy>" in line or bool(_TOOL_FRAME.search(line))
        elif not line.startswith(" "):
            skipping = False
        if not skipping:
            kept.append(line)
    return "\n".join(kept[-lines:])


_COLLECTIVE_FRAME = re.compile(r'File "[^"]*[/\\\\]torch[/\\\\]distributed[/\\\\]')


def raised_in_collective(traceback: str) -> bool:
    """Whether the exception came out of torch.distributed: often a peer's failure seen from here.

    gloo raises "Connection closed by peer" in the collective a rank waits in once the rank it
    waits for has died; which of the two tracebacks the job leaves then depends on timing.
    """
    return bool(_COLLECTIVE_FRAME.search(traceback))


def exception_line(traceback: str) -> str:
    """``ValueError: ...``: the first unindented line after a traceback's last frame."""
    lines = traceback.splitlines()
    last_frame = max((i for i, line in enumerate(lines) if line.startswith("  File ")), default=-1)
    return next((line for line in lines[last_frame + 1 :] if line and not line.startswith(" ")), "")


def raised_report(raised: dict[int, str]) -> str:
    """The ranks' own exceptions (rank -> traceback), the one that started it first.

    A rank that raised outside torch.distributed leads; one that raised inside a collective (its
    peer's death seen from there) follows and is marked as a consequence.
    """
    order = sorted(raised, key=lambda r: (raised_in_collective(raised[r]), r))
    origin = next((r for r in order if not raised_in_collective(raised[r])), None)
    parts = []
    for r in order:
        tb = raised[r]
        later = ""
        if origin is not None and r != origin and raised_in_collective(tb):
            later = f" (inside a collective, after rank {origin} raised: a consequence of it)"
        parts.append(f"rank {r} raised {exception_line(tb)}{later}\n{tb}\n")
    return "\n".join(parts)
