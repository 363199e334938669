"""Resume only the same run: a changed config is refused (keys, both values, the ways on) or allowed on purpose."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.config.loader import CONFIG_NAMES, ConfigWarning, load_config
from repro.run.checkpoints import CheckpointStore
from repro.run.paths import RUN_STATE, RunPaths, choose_run_paths, write_run_state
from repro.run.preflight import InputError
from repro.run.resume import IGNORED, check_resume, diff, is_ignored, record_config, result_config
from tests.subprocess_env import pythonpath


def _load(overrides=(), name="grpo_tiny"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        return load_config(list(overrides), config_name=name)


def _started_run(tmp_path: Path, overrides=()) -> Path:
    """A run folder as a run leaves it after its step-2 checkpoint (config recorded, marker written)."""
    run_dir = tmp_path / "outputs" / "grpo_tiny_arith_20260101_000000"
    store = CheckpointStore(run_dir / "checkpoints")
    (store.begin(2) / "trainer_state.json").write_text("{}")
    store.commit(2)
    record_config(_load(overrides), RunPaths(run_dir, run_dir / "checkpoints", None, 0), {})
    write_run_state(run_dir, status="interrupted")
    return run_dir


@pytest.fixture
def outputs(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_OUTPUTS_DIR", str(tmp_path / "outputs"))
    return tmp_path / "outputs"


def test_auto_resume_with_a_changed_lr_and_seed_is_refused_with_keys_values_and_ways_on(tmp_path, outputs):
    run_dir = _started_run(tmp_path)
    cfg = _load(["actor_rollout_ref.actor.optim.lr=1e-3", "data.seed=3"])
    paths = choose_run_paths(cfg)
    assert paths.run_dir == run_dir
    with pytest.raises(InputError) as e:
        check_resume(cfg, paths)
    msg = str(e.value)
    assert "actor_rollout_ref.actor.optim.lr: 0.0001 -> 0.001" in msg and "data.seed: 0 -> 3" in msg
    for way in ("trainer.experiment_name", "trainer.resume_mode=disable", "trainer.resume_mode=resume_path",
                f"trainer.resume_from_path={run_dir / 'checkpoints' / 'global_step_2'}",
                "trainer.allow_config_change=[actor_rollout_ref.actor.optim.lr,data.seed]"):
        assert way in msg
    assert len(msg.splitlines()) == 1


def test_same_config_resumes_and_steps_freqs_and_logging_may_differ(tmp_path, outputs):
    run_dir = _started_run(tmp_path)
    cfg = _load(["trainer.total_training_steps=90", "trainer.save_freq=5", "trainer.test_freq=3",
                 "trainer.progress=plain", "trainer.max_actor_ckpt_to_keep=4"])
    paths = choose_run_paths(cfg)
    assert paths.run_dir == run_dir and paths.resume_step == 2
    assert check_resume(cfg, paths) == {}


def test_explicit_resume_path_allows_the_listed_keys_and_records_them(tmp_path, outputs):
    run_dir = _started_run(tmp_path)
    ckpt = run_dir / "checkpoints" / "global_step_2"
    base = ["actor_rollout_ref.actor.optim.lr=1e-3", "trainer.resume_mode=resume_path", f"trainer.resume_from_path={ckpt}"]
    with pytest.raises(InputError, match="optim.lr: 0.0001 -> 0.001"):
        check_resume(_load(base), choose_run_paths(_load(base)))
    cfg = _load(base + ["trainer.allow_config_change=[actor_rollout_ref.actor.optim.lr]"])
    paths = choose_run_paths(cfg)
    changes = check_resume(cfg, paths)
    assert changes == {"actor_rollout_ref.actor.optim.lr": (0.0001, 0.001)}
    record_config(cfg, paths, changes)
    state = json.loads((paths.run_dir / RUN_STATE).read_text())
    assert state["config"]["actor_rollout_ref.actor.optim.lr"] == 0.001
    assert state["config_changes"] == [{"resumed_from": str(ckpt), "step": 2, "changed": {
        "actor_rollout_ref.actor.optim.lr": {"old": 0.0001, "new": 0.001}}}]
    # Only the listed key: another change is still refused.
    cfg = _load(base + ["data.seed=5", "trainer.allow_config_change=[actor_rollout_ref.actor.optim.lr]"])
    with pytest.raises(InputError, match=r"data.seed: 0 -> 5"):
        check_resume(cfg, choose_run_paths(cfg))


def test_allow_config_change_names_real_result_keys_and_needs_resume_path(tmp_path):
    with pytest.raises(ValueError, match="needs trainer.resume_mode=resume_path"):
        _load(["trainer.allow_config_change=[data.seed]"])
    ckpt = tmp_path / "global_step_1"
    ckpt.mkdir()
    for key, match in (("data.sed", "not a config key"), ("trainer.save_freq", "may change between resumes")):
        cfg = _load(["trainer.resume_mode=resume_path", f"trainer.resume_from_path={ckpt}",
                     f"trainer.allow_config_change=[{key}]", f"trainer.output_dir={tmp_path / 'o'}"])
        with pytest.raises(InputError, match=match):
            check_resume(cfg, choose_run_paths(cfg))


def test_failed_run_folder_without_a_checkpoint_is_never_adopted(tmp_path, outputs):
    failed = outputs / "grpo_tiny_arith_20260102_000000"
    failed.mkdir(parents=True)
    write_run_state(failed, status="failed")
    paths = choose_run_paths(_load())
    assert paths.run_dir != failed and paths.resumed_from is None


def test_auto_resume_of_a_folder_without_a_recorded_config_is_refused(tmp_path, outputs):
    run_dir = _started_run(tmp_path)
    state = json.loads((run_dir / RUN_STATE).read_text())
    del state["config"]
    (run_dir / RUN_STATE).write_text(json.dumps(state))
    cfg = _load()
    with pytest.raises(InputError, match="records no config"):
        check_resume(cfg, choose_run_paths(cfg))


def test_every_config_name_has_its_own_default_experiment_name():
    # Dry: grpo_0p6b's vLLM rollout is refused outright where vllm is not installed (a real run).
    names = {name: _load(["trainer.dry_run=true"], name=name).trainer.experiment_name for name in CONFIG_NAMES}
    assert len(set(names.values())) == len(names), names


def test_ppo_trainer_with_the_readme_gsm8k_keys_never_adopts_a_grpo_tiny_run(tmp_path, outputs):
    _started_run(tmp_path)
    cfg = _load(["algorithm.adv_estimator=grpo", "critic.enable=False"], name="ppo_trainer")
    assert choose_run_paths(cfg).resumed_from is None


GRPO_TINY = result_config(_load())


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(sorted(GRPO_TINY)), st.integers(0, 3))
def test_any_result_key_change_is_seen_and_ignored_keys_never_are(key, salt):
    base = GRPO_TINY
    assert not any(is_ignored(k) for k in base)
    changed = dict(base)
    changed[key] = ["changed", salt]
    assert list(diff(base, changed)) == [key]
    assert "trainer.total_training_steps" in IGNORED and "trainer.save_freq" in IGNORED


def test_main_ppo_refuses_a_changed_resume_before_importing_the_trainer(tmp_path):
    import os
    import resource
    import subprocess
    import sys
    import time

    run_dir = _started_run(tmp_path)
    before = {p.name: p.stat().st_mtime for p in run_dir.iterdir()}
    root = Path(__file__).resolve().parents[3]
    code = ("import runpy, sys\n"
            "try:\n    runpy.run_module('repro.main_ppo', run_name='__main__')\n"
            "finally:\n    print('heavy imports:', [m for m in ('torch', 'ray', 'deepspeed') if m in sys.modules], "
            "file=sys.stderr)\n")
    env = {**os.environ, "PYTHONPATH": pythonpath(root), "REPRO_OUTPUTS_DIR": str(tmp_path / "outputs")}
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, "-cn", "grpo_tiny", "trainer.device=cpu", "data.seed=3"],
                          env=env, capture_output=True, text=True, timeout=60)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - usage.ru_utime + after.ru_stime - usage.ru_stime
    assert proc.returncode == 2 and "data.seed: 0 -> 3" in proc.stderr, proc.stderr
    assert "heavy imports: []" in proc.stderr and "Traceback" not in proc.stderr
    assert cpu < 5.0 and wall < 30.0, (cpu, wall)
    assert {p.name: p.stat().st_mtime for p in run_dir.iterdir()} == before
