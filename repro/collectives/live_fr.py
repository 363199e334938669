"""Flight Recorder read live from every rank: what runs below the Python API, with the user's stack.

DDP's reducer, FSDP2's and DTensor's C++ paths and ``ProcessGroup`` methods called directly never
pass through ``torch.distributed``'s Python functions, but every collective a ProcessGroup runs is
entered in PyTorch's Flight Recorder (gloo and NCCL in torch 2.13) together with the Python stack
that issued it (for DDP, the user's ``loss.backward()`` line). Ranks started by ``launch`` turn
the recorder on (``TORCH_FR_BUFFER_SIZE``, unless set) and run a small daemon thread that writes
``fr_trace_rank_<R>`` into the trace directory when the launcher asks (a trigger file, so it
works while the main thread is blocked inside a C++ collective) and when the rank exits.
``analyze`` aligns those dumps when the Python-level records show no divergence.
"""

from __future__ import annotations

import atexit
import os
import pathlib
import threading

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


def _watch(out_dir: pathlib.Path, rank: int, stop: threading.Event) -> None:
    trigger = out_dir / TRIGGER
    seen = trigger.stat().st_mtime if trigger.exists() else None
    while not stop.wait(_POLL_S):
        if trigger.exists() and trigger.stat().st_mtime != seen:
            seen = trigger.stat().st_mtime
            dump(out_dir, rank)


def start(out_dir: str | os.PathLike) -> None:
    """In a rank: dump on the launcher's trigger and at exit (call before the script runs)."""
    path = pathlib.Path(out_dir)
    rank = int(os.environ.get("RANK", "0"))
    stop = threading.Event()
    threading.Thread(target=_watch, args=(path, rank, stop), daemon=True, name="repro-fr-dump").start()

    def at_exit() -> None:
        stop.set()
        dump(path, rank)

    atexit.register(at_exit)


def request_dumps(out_dir: pathlib.Path) -> None:
    """In the launcher: ask every live rank for its Flight Recorder entries now."""
    (out_dir / TRIGGER).write_text(str(os.getpid()))
