"""What an interrupted run records and the one line that says how to resume it."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from repro.cluster.signals import ignore_signals, sigterm_received, terminate_as_interrupt
from repro.run import interrupts
from repro.run.checkpoints import CheckpointStore
from repro.run.interrupts import hold_after_checkpoint, mark_interrupted
from repro.run.paths import RUN_STATE, RunPaths


def _paths(tmp_path, step=None):
    ckpt = tmp_path / "checkpoints"
    if step is not None:  # a committed checkpoint (manifest written), as the trainer leaves it
        store = CheckpointStore(ckpt)
        (store.begin(step) / "trainer_state.json").write_text("{}")
        store.commit(step)
    return RunPaths(tmp_path, ckpt, None, 0)


def test_interrupted_run_records_its_last_complete_checkpoint_and_says_the_same_command_resumes(tmp_path):
    line = mark_interrupted(_paths(tmp_path, step=4), ["-cn", "grpo_tiny", "data.seed=2"])
    state = json.loads((tmp_path / RUN_STATE).read_text())
    assert state["status"] == "interrupted" and state["last_checkpoint_step"] == 4
    assert state["last_checkpoint"] == str(tmp_path / "checkpoints" / "global_step_4")
    assert "step 4" in line and line.endswith("-m repro.main_ppo -cn grpo_tiny data.seed=2") and "\n" not in line


def test_interrupt_before_any_checkpoint_says_there_is_nothing_to_resume(tmp_path):
    line = mark_interrupted(_paths(tmp_path), ["-cn", "grpo_tiny"])
    assert json.loads((tmp_path / RUN_STATE).read_text())["last_checkpoint"] is None
    assert "before the first checkpoint" in line


def test_a_resume_path_run_is_continued_in_its_own_folder(tmp_path):
    argv = ["-cn", "grpo_tiny", "trainer.resume_mode=resume_path", "trainer.resume_from_path=/old/global_step_2",
            "trainer.allow_config_change=[data.seed]", "data.seed=3"]
    line = mark_interrupted(_paths(tmp_path, step=6), argv)
    command = line.split("Resume with: ", 1)[1]
    assert "trainer.resume_mode" not in command and "allow_config_change" not in command
    assert line.endswith(f"-cn grpo_tiny data.seed=3 trainer.output_dir={tmp_path}")


def test_sigterm_becomes_the_interrupt_of_ctrl_c_and_cleanup_ignores_a_second_signal():
    # Whatever the process started with (a background job of a non-interactive shell starts with
    # SIGINT ignored, not with Python's default handler) is what must come back.
    before = signal.getsignal(signal.SIGINT)
    with terminate_as_interrupt():
        assert not sigterm_received()
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
        # Remembered for the stop, which then makes no call that waits on Ray's GCS (it may have the SIGTERM too).
        assert sigterm_received()
    assert not sigterm_received()  # a later run in this process starts afresh
    with ignore_signals():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGINT) is before


def test_the_hold_after_a_checkpoint_waits_only_at_its_step_and_a_signal_ends_it(monkeypatch):
    monkeypatch.setenv(interrupts.HOLD_ENV, "2")
    monkeypatch.setattr(interrupts, "_HOLD_MAX_S", 0.5)
    started = time.monotonic()
    hold_after_checkpoint(1)
    hold_after_checkpoint(3)
    assert time.monotonic() - started < 0.1
    hold_after_checkpoint(2)
    assert time.monotonic() - started >= 0.5
    monkeypatch.setenv(interrupts.HOLD_ENV, "2:0.3")
    started = time.monotonic()
    hold_after_checkpoint(2)
    assert 0.3 <= time.monotonic() - started < 0.5
    monkeypatch.setenv(interrupts.HOLD_ENV, "2")
    monkeypatch.setattr(interrupts, "_HOLD_MAX_S", 30.0)
    started = time.monotonic()
    with terminate_as_interrupt(), pytest.raises(KeyboardInterrupt):
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        previous = signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
        try:
            hold_after_checkpoint(2)
        finally:
            signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - started < 5


def test_the_resume_line_names_the_interpreter_that_ran_the_job(tmp_path, monkeypatch):
    # Under .venv/bin/python a bare "python" may be another interpreter, without repro or torch.
    venv_python = tmp_path / ".venv" / "bin" / "python"
    monkeypatch.setattr(interrupts.sys, "executable", str(venv_python))
    monkeypatch.chdir(tmp_path)
    assert interrupts.resume_command(["-cn", "grpo_tiny"]) == ".venv/bin/python -m repro.main_ppo -cn grpo_tiny"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert interrupts.resume_command([]) == f"{venv_python} -m repro.main_ppo"
