"""Ctrl-C and SIGTERM: stop cleanly, say where the run stands and how to continue it.

The driver turns SIGTERM into the ``KeyboardInterrupt`` that Ctrl-C raises
(``repro.cluster.signals``), so both take one path: the trainer's ``finally`` blocks kill the rank actors,
:func:`mark_interrupted` records ``status: interrupted`` with the last complete checkpoint in
``run.json`` and returns the one line that tells how to resume, and Ray is shut down last (the
record needs no cluster). A SIGTERM to the whole process group (GNU timeout, ``kill -TERM -<pgid>``)
or to every process of the job stops Ray's own processes at the same moment; the stop then waits
on nothing they must answer (``repro.cluster.signals``). A second signal while that cleanup runs is
ignored (``repro.cluster.signals.ignore_signals``), so it cannot leave processes behind.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time
from pathlib import Path

from repro.run.paths import RunPaths, latest_checkpoint, write_run_state

INTERRUPTED_EXIT = 130  # what a shell reports for a command ended by SIGINT
# Fault injection for the interruption tests: the driver pauses after this step's checkpoint.
HOLD_ENV = "REPRO_HOLD_AFTER_CHECKPOINT"
_HOLD_MAX_S = 300.0


def hold_after_checkpoint(step: int) -> None:
    """With ``REPRO_HOLD_AFTER_CHECKPOINT=<step>[:<seconds>]``, wait after that step's checkpoint
    (300 s unless given).

    A test that stops a run (Ctrl-C, SIGTERM, kill -9, a lost node) once a checkpoint is on disk
    needs the run to still be going when the stop lands. Without the pause a short run can finish
    its last steps first on a loaded machine, and the test sees exit 0. A signal ends the pause
    early; a test that removes a node gives seconds, so the run goes on and meets the loss.
    """
    target, _, seconds = os.environ.get(HOLD_ENV, "").partition(":")
    if target != str(step):
        return
    logging.getLogger("repro.trainer").warning("holding after the step-%d checkpoint (%s)", step, HOLD_ENV)
    time.sleep(float(seconds) if seconds else _HOLD_MAX_S)  # a signal's handler raises out of it


def resume_command(argv: list[str] | None = None) -> str:
    """The command line that continues this run (the same one: auto-resume finds the folder)."""
    argv = sys.argv[1:] if argv is None else argv
    return shlex.join([_interpreter(), "-m", "repro.main_ppo", *argv])


def _interpreter() -> str:
    """The interpreter that ran this job (``.venv/bin/python``, not a bare ``python`` that may
    be another one), relative to the working directory when it lies inside it."""
    exe = Path(sys.executable)
    try:
        return str(exe.relative_to(Path.cwd()))
    except ValueError:
        return str(exe)


def _continue_argv(paths: RunPaths, argv: list[str]) -> list[str]:
    """``argv`` made to continue ``paths.run_dir``: an explicit resume_path run goes on in its own folder."""
    if not any(a.lstrip("+").startswith("trainer.resume_mode=resume_path") for a in argv):
        return argv
    dropped = ("trainer.resume_mode=", "trainer.resume_from_path=", "trainer.allow_config_change=", "trainer.output_dir=")
    return [a for a in argv if not a.lstrip("+").startswith(dropped)] + [f"trainer.output_dir={paths.run_dir}"]


def mark_interrupted(paths: RunPaths, argv: list[str] | None = None) -> str:
    """Record the interruption in ``run.json``; returns the line telling how to resume."""
    try:
        found = latest_checkpoint(paths.ckpt_dir) if paths.ckpt_dir.is_dir() else None
    except ValueError:
        found = None
    last = str(found[0]) if found else None
    argv = _continue_argv(paths, sys.argv[1:] if argv is None else argv)
    write_run_state(paths.run_dir, status="interrupted", last_checkpoint=last,
                    last_checkpoint_step=found[1] if found else None)
    if found is None:
        return (f"interrupted before the first checkpoint: nothing to resume in {paths.run_dir}; "
                f"run again to start over: {resume_command(argv)}")
    return (f"interrupted; last complete checkpoint: step {found[1]} ({last}). "
            f"Resume with: {resume_command(argv)}")
