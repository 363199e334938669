"""When a traced job stops making progress: the hang watch, the stacks, Flight Recorder dumped live.

**The hang watch.** Every traced call appends to its rank's record before it runs and again when
it returns, so a record that stops growing means a rank that stopped issuing and finishing calls.
The job is called hung when, for ``stall_s`` seconds, no live rank's record grew *and* some live
rank has a traced call (or wait) that never returned, or some rank has already exited (the live
ones then wait for it, maybe in a collective run below the Python API): ranks that merely compute
for a long time between collectives have nothing outstanding and are left alone. A rank that has
not issued its first traced call yet may still be starting: until every live rank has, a stall
needs :data:`START_GRACE_S` (unless a rank has exited). A rank whose
script has returned writes an ``end`` event; it is not waiting for anyone, however long its
interpreter takes to tear down. Ranks started by ``repro.collectives_trace run`` dump their Python
stacks to stderr (their log) on :data:`STACK_SIGNAL`, through :func:`faulthandler.register`.

**Flight Recorder read live from every rank**: what runs below the Python API, with the user's
stack. DDP's reducer, FSDP2's and DTensor's C++ paths and ``ProcessGroup`` methods called directly
never pass through ``torch.distributed``'s Python functions, but every collective a ProcessGroup
runs is entered in PyTorch's Flight Recorder (gloo and NCCL in torch 2.13) together with the
Python stack that issued it (for DDP, the user's ``loss.backward()`` line). Every rank running
under ``python -m repro.collectives_trace run`` - started by ``launch`` or by torchrun - turns the
recorder on (:func:`arm_flight_recorder`: ``TORCH_FR_BUFFER_SIZE``, unless set; torch reads it
when the process group is made, after this) and runs a small daemon thread that writes
``fr_trace_rank_<R>`` into the trace directory:

- when ``launch`` asks (:func:`request_dumps`: a trigger file, so it works while the main thread
  is blocked inside a C++ collective);
- when the rank's own record has stalled for ``stall_s`` with a call outstanding (the hang watch
  above, on this rank's record alone): under torchrun no launcher watches, and a rank blocked in a
  collective runs no Python signal handler;
- on SIGTERM (torchrun's agent ends the workers with it when one fails or it is interrupted), when
  the program left that signal to its default; then the rank dies of it as it would have;
- when the rank exits.

``analyze`` aligns those dumps when the Python-level records show no divergence.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pathlib
import signal
import sys
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

from repro.collectives.events import read_trace_file

STACK_SIGNAL = signal.SIGUSR1
_WATCH_POLL_S = 0.5
START_GRACE_S = 60.0
"""While a live rank has no record yet (no traced call so far) and no rank has exited, the job may still
be starting: ranks launched together need not reach their first collective together (an interpreter
and its torch import can take longer than a short ``stall_s`` on a loaded machine, and the rank that
got there first waits for it). A stall then needs this long, not ``stall_s``."""


def register_stack_dump() -> None:
    """Make this process print every thread's Python stack to stderr on :data:`STACK_SIGNAL`."""
    import faulthandler

    faulthandler.register(STACK_SIGNAL, all_threads=True, chain=False)


class ProgressWatch:
    """Tracks the growth of ``rank*.jsonl`` in a trace directory."""

    def __init__(self, out_dir: pathlib.Path, stall_s: float) -> None:
        self.out_dir = out_dir
        self.stall_s = stall_s
        self._sizes: dict[int, int] = {}
        self._last_change = time.monotonic()
        self._next_poll = 0.0

    def idle_s(self) -> float:
        """Seconds since any rank's record last grew."""
        return time.monotonic() - self._last_change

    def _poll(self, live: list[int]) -> None:
        for rank in live:
            path = self.out_dir / f"rank{rank}.jsonl"
            size = path.stat().st_size if path.exists() else 0
            if self._sizes.get(rank) != size:
                self._sizes[rank] = size
                self._last_change = time.monotonic()

    def outstanding(self, live: list[int]) -> bool:
        """Whether a live rank's record ends in a call that never returned."""
        for rank in live:
            path = self.out_dir / f"rank{rank}.jsonl"
            if path.exists() and any(c.t_end is None for c in read_trace_file(path).calls):
                return True
        return False

    def stalled(self, live: list[int], finished: bool = False) -> bool:
        """Poll (at most every 0.5 s); True once the job counts as hung (never when ``stall_s`` is 0).

        ``finished``: some rank already exited. Live ranks that then make no progress wait for
        it, even when what they wait in runs below the Python API (DDP's reducer, FSDP2).
        """
        now = time.monotonic()
        if self.stall_s <= 0 or not live or now < self._next_poll:
            return False
        self._next_poll = now + _WATCH_POLL_S
        self._poll(live)
        if self.idle_s() < self.stall_s:
            return False
        waiting = [r for r in live if not self._ended(r)]  # not those tearing down after the script
        starting = not finished and any(not (self.out_dir / f"rank{r}.jsonl").exists() for r in live)
        if starting and self.idle_s() < max(self.stall_s, START_GRACE_S):
            return False
        return bool(waiting) and (finished or self.outstanding(waiting))

    def _ended(self, rank: int) -> bool:
        path = self.out_dir / f"rank{rank}.jsonl"
        if not path.exists():
            return False
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 64))
            return b'"ev":"end"' in f.read()


# -- Flight Recorder, dumped live --------------------------------------------------------------

TRIGGER = ".dump_flight_recorder"
DEFAULT_ENTRIES = "2000"
_DUMP_POLL_S = 0.2


def dump_flight_recorder(out_dir: pathlib.Path, rank: int) -> bool:
    """Write this rank's Flight Recorder entries (atomically: a reader never sees half a dump)."""
    try:
        import torch

        with _no_inductor_import(torch):
            data = torch._C._distributed_c10d._dump_fr_trace()
    except Exception:  # no process group yet, or a torch without the recorder
        return False
    tmp_dir = out_dir / ".fr_tmp"
    tmp_dir.mkdir(exist_ok=True)
    tmp = tmp_dir / f"fr_trace_rank_{rank}"
    tmp.write_bytes(data)
    os.replace(tmp, out_dir / f"fr_trace_rank_{rank}")
    return True


class _NoCompiledCode:
    """``PyCodeCache`` of a process that never imported ``torch._inductor``: no code was compiled, so
    no frame maps to a compiled graph's source (the real ``stack_frames_for_code`` returns None for
    any path not in ``PyCodeCache.linemaps``, which only inductor's own loads fill)."""

    @staticmethod
    def stack_frames_for_code(path: str, lineno: int) -> None:
        return None


@contextlib.contextmanager
def _no_inductor_import(torch: Any) -> Iterator[None]:
    """torch's stack symbolizer asks ``torch._inductor.codecache.PyCodeCache`` about every Python
    frame of a dump (looked up at each dump, not cached). In a process that never imported
    ``torch._inductor`` that lookup imported it, and ``torch._dynamo`` with it, for an answer that
    is None for every frame: ~2 CPU s per rank on a 2-core machine, in every rank's dump at exit.
    While the dump runs, ``torch._inductor`` answers with :class:`_NoCompiledCode` instead, so the
    frames are the same (checked: the pickled frames of both ways equal). Where inductor is
    imported (a compiled program) the real one answers."""
    if "torch._inductor" in sys.modules:
        yield
        return
    stub = types.SimpleNamespace(codecache=types.SimpleNamespace(PyCodeCache=_NoCompiledCode))
    torch._inductor = stub
    try:
        yield
    finally:
        if torch.__dict__.get("_inductor") is stub:  # a real import meanwhile replaced it: leave that
            del torch._inductor


def _watch(out_dir: pathlib.Path, rank: int, stop: threading.Event, hang: ProgressWatch | None) -> None:
    trigger = out_dir / TRIGGER
    record = out_dir / f"rank{rank}.jsonl"
    seen = trigger.stat().st_mtime if trigger.exists() else None
    dumped_at = -1  # the record's size at the last stall dump: one dump per stall
    while not stop.wait(_DUMP_POLL_S):
        if trigger.exists() and trigger.stat().st_mtime != seen:
            seen = trigger.stat().st_mtime
            dump_flight_recorder(out_dir, rank)
        if hang is not None and hang.stalled([rank]):
            size = record.stat().st_size if record.exists() else 0
            if size != dumped_at and dump_flight_recorder(out_dir, rank):
                dumped_at = size


def _dump_on_sigterm(out_dir: pathlib.Path, rank: int) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # the program handles it: leave its shutdown alone

    def on_term(signum: int, _frame: object) -> None:
        dump_flight_recorder(out_dir, rank)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_term)


def arm_flight_recorder(out_dir: str | os.PathLike, stall_s: float = 0.0) -> None:
    """In a rank: arm the recorder and dump it as the module docstring says (call before the script runs).

    ``stall_s``: 0 when a launcher watches the ranks and asks for the dumps itself.
    """
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", DEFAULT_ENTRIES)
    path = pathlib.Path(out_dir)
    rank = int(os.environ.get("RANK", "0"))
    stop = threading.Event()
    hang = ProgressWatch(path, stall_s) if stall_s > 0 else None
    threading.Thread(target=_watch, args=(path, rank, stop, hang), daemon=True, name="repro-fr-dump").start()
    _dump_on_sigterm(path, rank)

    def at_exit() -> None:
        stop.set()
        dump_flight_recorder(path, rank)

    atexit.register(at_exit)


def request_dumps(out_dir: pathlib.Path) -> None:
    """In the launcher: ask every live rank for its Flight Recorder entries now."""
    (out_dir / TRIGGER).write_text(str(os.getpid()))
