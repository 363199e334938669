"""One phase of ``scripts/seed_scale.sh`` run here, on CPU, as a device command would run it.

A key misspelt in a phase costs a device session; the tests that compose the phases (repro's trainer
in ``tests/unit/test_seed_scale.py``, verl's in ``tests/verl_parity/engine/test_gpu_tools.py``) start
them through :func:`run_phase`, each in folders of its own test.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.subprocess_env import pythonpath

ROOT = Path(__file__).resolve().parents[1]
# The script's knobs a caller's shell may have set (a device session's): none may reach a test's phase.
KNOBS = ("GPUS", "TRACE", "RUN_NAME", "DEADLINE")


def run_phase(tmp_path: Path, *args: str, timeout: int = 300, **env_vars: str) -> tuple[subprocess.CompletedProcess, Path]:
    """``bash scripts/seed_scale.sh ARGS`` with its outputs, run folders and cache under ``tmp_path``
    and this interpreter as its Python; returns the process and the phase's ``$OUT`` folder."""
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), REPRO_OUTPUTS_DIR=str(tmp_path / "routs"), PY=sys.executable,
               PYTHONPATH=pythonpath(ROOT), REPRO_CACHE_DIR=str(tmp_path / "cache"))
    for knob in KNOBS:
        env.pop(knob, None)
    env.update(env_vars)
    proc = subprocess.run(["bash", "scripts/seed_scale.sh", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    return proc, out
