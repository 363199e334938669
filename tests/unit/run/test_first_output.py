"""A newcomer is never left without output: a first line within 2 s, the model and data named.

The first line is read from a real subprocess (what a user sees); the run is stopped by an input
error right after, so nothing heavy starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from repro.config.loader import load_config
from repro.main_ppo import USAGE, main
from repro.run.banner import inputs_lines
from tests.subprocess_env import pythonpath

ROOT = Path(__file__).resolve().parents[3]


def test_first_line_comes_within_2_s_and_says_what_is_starting(tmp_path):
    env = {**os.environ, "PYTHONPATH": pythonpath(ROOT), "DS_ACCELERATOR": "cpu"}
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "repro.main_ppo", "-cn", "grpo_tiny", "trainer.device=cpu",
                             f"data.train_files={tmp_path / 'none.parquet'}"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    elapsed = time.monotonic() - start
    proc.communicate(timeout=60)
    assert "checking the inputs" in first and elapsed < 2.0, (first, elapsed)
    assert proc.returncode == 2


def test_dry_run_names_the_built_in_policy_and_data(capsys):
    assert main(["-cn", "ppo_trainer", "trainer.dry_run=true", "trainer.device=cpu"]) == 0
    out = capsys.readouterr().out
    assert "model: built-in policy tiny" in out and "train data: the built-in arithmetic task" in out


def test_banner_names_model_folder_files_and_reward_plugin(tmp_path):
    for name in ("a.parquet", "b.parquet"):
        (tmp_path / name).write_bytes(b"x")
    cfg = load_config([f"actor_rollout_ref.model.path={tmp_path}",
                       f"data.train_files=[{tmp_path}/a.parquet,{tmp_path}/b.parquet]",
                       "reward.custom_reward_function.path=/r.py"], config_name="ppo_trainer")
    assert inputs_lines(cfg) == [f"  model: {tmp_path}", f"  train data: {tmp_path}/a.parquet, {tmp_path}/b.parquet",
                                 "  val data: the built-in arithmetic task",
                                 "  reward: compute_score from /r.py (reward.custom_reward_function)"]


def test_help_says_what_ppo_trainer_does_without_a_model_path():
    assert "without them it trains the built-in tiny policy" in USAGE
