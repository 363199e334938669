"""Flight Recorder read live from every rank: what runs below the Python API, with the user's stack.

DDP's reducer, FSDP2's and DTensor's C++ paths and ``ProcessGroup`` methods called directly never
pass through ``torch.distributed``'s Python functions, but every collective a ProcessGroup runs is
entered in PyTorch's Flight Recorder (gloo and NCCL in torch 2.13) together with the Python stack
that issued it (for DDP, the user's ``loss.backward()`` line). Every rank running under
``python -m repro.collectives_trace run`` - started by ``launch`` or by torchrun - turns the
recorder on (``TORCH_FR_BUFFER_SIZE``, unless set; torch reads it when the process group is
made, after this) and runs a small daemon thread that writes ``fr_trace_rank_<R>`` into the trace
directory:

- when ``launch`` asks (a trigger file, so it works while the main thread is blocked inside a
  C++ collective);
- when the rank's own record has stalled for ``stall_s`` with a call outstanding (the hang watch of
  :mod:`repro.collectives.watch`, on this rank's record alone): under torchrun no launcher watches,
  and a rank blocked in a collective runs no Python signal handler;
- on SIGTERM (torchrun's agent ends the workers with it when one fails or it is interrupted), when
  the program left that signal to its default; then the rank dies of it as it would have;
- when the rank exits.

``analyze`` aligns those dumps when the Python-level records show no divergence. Imports nothing
of repro but :mod:`repro.collectives.watch`.
"""

from __future__ import annotations

import atexit
import os
import pathlib
import signal
import threading

from repro.collectives.watch import ProgressWatch

TRIGGER = ".dump_flight_recorder"
DEFAULT_ENTRIES = "2000"
_POLL_S = 0.2


def dump(out_dir: pathlib.Path, rank: int) -> bool:
    """Write this rank's Flight Recorder entries (atomically: a reader never sees half a dump)."""
    try:
        import torch

        data = torch._C._distributed_c10d._dump_fr_trace()
    except Exception:  # no process group yet, or a torch without the recorder
        return False
    tmp_dir = out_dir / ".fr_tmp"
    tmp_dir.mkdir(exist_ok=True)
    tmp = tmp_dir / f"fr_trace_rank_{rank}"
    tmp.write_bytes(data)
    os.replace(tmp, out_dir / f"fr_trace_rank_{rank}")
    return True


def _watch(out_dir: pathlib.Path, rank: int, stop: threading.Event, hang: ProgressWatch | None) -> None:
    trigger = out_dir / TRIGGER
    record = out_dir / f"rank{rank}.jsonl"
    seen = trigger.stat().st_mtime if trigger.exists() else None
    dumped_at = -1  # the record's size at the last stall dump: one dump per stall
    while not stop.wait(_POLL_S):
        if trigger.exists() and trigger.stat().st_mtime != seen:
            seen = trigger.stat().st_mtime
            dump(out_dir, rank)
        if hang is not None and hang.stalled([rank]):
            size = record.stat().st_size if record.exists() else 0
            if size != dumped_at and dump(out_dir, rank):
                dumped_at = size


def _dump_on_sigterm(out_dir: pathlib.Path, rank: int) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # the program handles it: leave its shutdown alone

    def on_term(signum: int, _frame: object) -> None:
        dump(out_dir, rank)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_term)


def start(out_dir: str | os.PathLike, stall_s: float = 0.0) -> None:
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
        dump(path, rank)

    atexit.register(at_exit)


def request_dumps(out_dir: pathlib.Path) -> None:
    """In the launcher: ask every live rank for its Flight Recorder entries now."""
    (out_dir / TRIGGER).write_text(str(os.getpid()))
