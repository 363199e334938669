"""Run-directory choice and resume discovery (what a restart with the same command picks up)."""

from __future__ import annotations

import pytest

from repro.config import RunConfig
from repro.run.checkpoints import CheckpointStore
from repro.run.paths import (
    LATEST,
    choose_run_paths,
    latest_checkpoint,
    resolve_builtin_assets,
    write_run_state,
)


@pytest.fixture
def outputs(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_OUTPUTS_DIR", str(tmp_path / "outputs"))
    return tmp_path / "outputs"


def _cfg(**trainer) -> RunConfig:
    cfg = RunConfig()
    cfg.trainer.experiment_name = "exp"
    for k, v in trainer.items():
        setattr(cfg.trainer, k, v)
    return cfg


def _checkpoint(run_dir, step):
    store = CheckpointStore(run_dir / "checkpoints")
    (store.begin(step) / "trainer_state.json").write_text("{}")
    store.commit(step)


def test_fresh_start_makes_a_timestamped_dir(outputs):
    paths = choose_run_paths(_cfg())
    assert paths.run_dir.parent == outputs and paths.run_dir.name.startswith("exp_")
    assert paths.resumed_from is None and paths.resume_step == 0


def test_auto_resume_reuses_latest_unfinished_run_and_its_latest_checkpoint(outputs):
    old, newer, other = outputs / "exp_20260101_000000", outputs / "exp_20260102_000000", outputs / "exp2_20270101_000000"
    for d in (old, newer, other):
        d.mkdir(parents=True)
    _checkpoint(newer, 4)
    paths = choose_run_paths(_cfg())
    assert paths.run_dir == newer and paths.resume_step == 4
    assert paths.resumed_from == newer / "checkpoints" / "global_step_4"


def test_finished_run_is_not_resumed(outputs):
    done = outputs / "exp_20260102_000000"
    done.mkdir(parents=True)
    _checkpoint(done, 4)
    write_run_state(done, status="finished")
    paths = choose_run_paths(_cfg())
    assert paths.run_dir != done and paths.resumed_from is None


def test_a_rerun_of_a_finished_job_says_where_that_run_is_and_that_this_is_a_new_run(outputs):
    older, done = outputs / "exp_20260101_000000", outputs / "exp_20260102_000000"
    for d in (older, done):
        d.mkdir(parents=True)
        _checkpoint(d, 4)
        write_run_state(d, status="finished", last_step=60)
    paths = choose_run_paths(_cfg())
    assert paths.previous_finished == done and paths.run_dir not in (older, done)
    [note] = paths.start_notes()
    assert f"finished (60 steps) in {done}" in note and f"this is a new run in {paths.run_dir}" in note


def test_a_first_run_says_nothing_and_a_resumed_one_says_where_it_continues(outputs):
    assert choose_run_paths(_cfg()).start_notes() == []
    run = outputs / "exp_20260102_000000"
    run.mkdir(parents=True)
    _checkpoint(run, 2)
    assert choose_run_paths(_cfg()).start_notes() == [f"resuming in {run} from the step-2 checkpoint"]


def test_resume_disabled_always_starts_fresh(outputs):
    run = outputs / "exp_20260102_000000"
    run.mkdir(parents=True)
    _checkpoint(run, 2)
    paths = choose_run_paths(_cfg(resume_mode="disable"))
    assert paths.run_dir != run and paths.resumed_from is None


def test_marker_naming_a_missing_step_is_not_trusted(tmp_path):
    _checkpoint(tmp_path, 3)
    (tmp_path / "checkpoints" / LATEST).write_text("7\n")
    assert latest_checkpoint(tmp_path / "checkpoints") == (tmp_path / "checkpoints" / "global_step_3", 3)


def test_resume_path_must_name_a_step_folder(tmp_path):
    with pytest.raises(ValueError, match="global_step_<N>"):
        choose_run_paths(_cfg(resume_mode="resume_path", resume_from_path=str(tmp_path), output_dir=str(tmp_path / "o")))


def test_a_run_without_a_critic_builds_no_policy_for_the_critics_default_path(tmp_path, monkeypatch):
    # The critic's default model.path is the tiny policy; a GRPO run of another model must not build it.
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    cfg = RunConfig()
    cfg.actor_rollout_ref.model.path = str(model)
    cfg.algorithm.adv_estimator = "grpo"
    cfg.critic.enable = False
    cfg.data.train_files = cfg.data.val_files = str(tmp_path / "x.parquet")
    out = resolve_builtin_assets(cfg)
    assert out.actor_rollout_ref.model.path == str(model) and out.critic.model.path == "tiny"
    assert not (tmp_path / "cache").exists()
