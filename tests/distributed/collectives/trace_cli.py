"""The trace tool's command line as a user runs it: ``python -m repro.collectives_trace <args>`` in
a subprocess with this checkout importable.

Shared by ``test_trace.py``, ``test_trace_zero2.py``, ``test_launch.py`` and ``test_library_collectives.py``; it lives here
because test modules never import each other (``tests/unit/test_test_layout.py``).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from tests.subprocess_env import pythonpath

REPO = pathlib.Path(__file__).resolve().parents[3]


def _command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "repro.collectives_trace", *args]


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=pythonpath(REPO))


def run_cli(args: list[str], cwd: pathlib.Path) -> subprocess.CompletedProcess:
    """The command to its end (2 minutes at most), its output captured; the test reads the exit status."""
    return subprocess.run(_command(args), cwd=cwd, env=_env(), capture_output=True, text=True, timeout=120)


def start_cli(args: list[str], cwd: pathlib.Path) -> subprocess.Popen:
    """The command started, stdout and stderr piped apart, for a test that signals or watches it."""
    return subprocess.Popen(_command(args), cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
