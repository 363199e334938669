"""Fixtures of the end-to-end suite: whole jobs as a user runs them (``python -m repro.main_ppo``, the
benchmark CLIs, ``scripts/goldens.py``), on 2 gloo ranks each; the trainer's jobs go through the job
harness ``tests/jobs.py``.

The suite is ``nox -s e2e`` (``pytest tests/e2e -n 2``); ``nox -s tests`` (CI) runs it after the unit and
distributed + slow suites. Its jobs join the worker's shared Ray head (``ray_head``, from
``tests/ray_head.py``) unless they test what happens to a job's own Ray processes; two jobs that several
proofs read run once per session (below). The root ``conftest.py`` marks its tests ``distributed``, as it
does the rank-level suite's: their jobs spawn real ranks.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.jobs import GRPO_3_STEPS, PPO_3_STEPS_KEEP, SharedRun


@pytest.fixture(scope="session")
def grpo_3_step_reference(tmp_path_factory: pytest.TempPathFactory, ray_head: str) -> Iterator[SharedRun]:
    """The uninterrupted 3-step GRPO job (``jobs.GRPO_3_STEPS``) that the 2-node test and the kill -9
    resume test both compare with: run once per session, by whichever of them starts first, and
    read by both from the folder all xdist workers share (the session's temp root; a worker's own
    basetemp without xdist). Saves one warm job per suite (~10 CPU s). A worker that starts it runs
    it on its own ``ray_head`` (torn down after this fixture, so the job never outlives it)."""
    yield from _shared_run(tmp_path_factory, "grpo_3_step_reference", "grpo_tiny", GRPO_3_STEPS, ray_head)


@pytest.fixture(scope="session")
def ppo_3_step_run(tmp_path_factory: pytest.TempPathFactory, ray_head: str) -> Iterator[SharedRun]:
    """The 3-step PPO job (``jobs.PPO_3_STEPS_KEEP``: a checkpoint every step, keep limits 1 actor
    and 2 critic) that test_trainer checks as a run and test_checkpoint_fallback for what each role
    keeps: run once per session, as ``grpo_3_step_reference``. Saves one PPO job (~15 CPU s)."""
    yield from _shared_run(tmp_path_factory, "ppo_3_step_run", "ppo_tiny", PPO_3_STEPS_KEEP, ray_head)


def _shared_run(tmp_path_factory: pytest.TempPathFactory, name: str, preset: str, overrides: list[str],
                ray_head: str) -> Iterator[SharedRun]:
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    run = SharedRun(root / name, preset, overrides, ray_head)
    try:
        yield run
    finally:
        run.close()
