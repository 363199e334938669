"""A benchmark's work folder: the model folder its invocations share, and a folder of each invocation's own.

Two benchmark commands may be given one ``--workdir`` (two GPUs of one host timed at once, or a rerun beside an
earlier one's files). They share the randomly initialised model (its bytes are a function of the shape), but never a
result: each invocation's children write their result and log files into a folder no other invocation names, so
the table a command prints holds only the rows its own children measured.

Imports: the standard library only.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def open_workdir(path: str | None, prefix: str) -> tuple[Path, Path]:
    """``(workdir, run_dir)``: ``path`` (a new temporary folder if None), created, and a new folder inside it for
    this invocation's per-case results and logs (``run_<UTC time>_<random>``: sorted by start, never reused)."""
    workdir = Path(path or tempfile.mkdtemp(prefix=prefix))
    workdir.mkdir(parents=True, exist_ok=True)
    run_dir = Path(tempfile.mkdtemp(prefix=time.strftime("run_%Y%m%dT%H%M%SZ_", time.gmtime()), dir=workdir))
    return workdir, run_dir


def save_once(out: Path, write: Callable[[Path], None], done: str = "config.json") -> Path:
    """``out``, made by ``write(folder)`` unless ``out/done`` exists. ``write`` fills a sibling temporary folder
    that is then renamed to ``out`` in one step, so a concurrent invocation sees no folder or a whole one; if another
    invocation renamed its copy first, this one's is removed and theirs is used."""
    if (out / done).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    part = Path(tempfile.mkdtemp(prefix=f"{out.name}.part_", dir=out.parent))
    try:
        write(part)
        try:
            os.rename(part, out)
        except OSError:  # another invocation's copy is in place (or a stale partial one, which is an error below)
            if not (out / done).is_file():
                raise
    finally:
        shutil.rmtree(part, ignore_errors=True)
    return out
