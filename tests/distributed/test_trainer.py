"""Short GRPO and PPO runs of the tiny policy on 2 CPU ranks through Ray (the lossless resume after a
kill -9 is in test_run_safety.py, on the same job as the kill -9 cleanup).

Each run is a real job in a subprocess (Ray, DeepSpeed ZeRO-2 on gloo, the hf rollout), built
from the ``grpo_tiny`` / ``ppo_tiny`` presets shrunk to a few small steps.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

from repro.rl.metrics import MetricsLog, read_summary

ROOT = Path(__file__).resolve().parents[2]
# Builds the config the way the CLI does (load_config), from a preset plus overrides.
RUNNER = (
    "import sys\n"
    "from repro.config.loader import load_config\n"
    "from repro.config.presets import preset_overrides\n"
    "from repro.trainer import run\n"
    "run(load_config(preset_overrides(sys.argv[1]) + sys.argv[2:]))\n"
)
SMALL = [
    "trainer.device=cpu",
    "data.train_batch_size=8",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "trainer.progress=plain",
]
# Metrics that must be identical between a resumed run and an uninterrupted one (timings excluded).
DETERMINISTIC = ("critic/score/mean", "critic/advantages/mean", "response_length/mean", "actor/pg_loss",
                 "actor/grad_norm", "actor/entropy", "actor/ppo_kl", "actor/lr")


def _command(preset: str, overrides: list[str]) -> list[str]:
    return [sys.executable, "-c", RUNNER, preset, *SMALL, *overrides]


def _env(tmp_path: Path, ray_address: str | None = None) -> dict[str, str]:
    """The job's environment; with ``ray_address`` (the ``ray_head`` fixture) it joins that cluster."""
    env = dict(os.environ)
    env["REPRO_OUTPUTS_DIR"] = str(tmp_path / "outputs")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    if ray_address:
        env.update(RAY_ADDRESS=ray_address, REPRO_REUSE_RANKS="1")
    return env


def _run(preset: str, overrides: list[str], tmp_path: Path, timeout: float = 240,
         ray_address: str | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(_command(preset, overrides), cwd=ROOT, env=_env(tmp_path, ray_address),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def _check_outputs(run_dir: Path, steps: int, required: tuple[str, ...]) -> list[dict]:
    for name in ("metrics.tsv", "summary.tsv", "curves.png", "config.yaml", "train.log", "run.json"):
        assert (run_dir / name).is_file(), f"{name} missing in {run_dir}"
    rows = MetricsLog(run_dir / "metrics.tsv").rows
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for key in required:
        values = [r.get(key) for r in rows]
        assert all(isinstance(v, float) and math.isfinite(v) for v in values), f"{key}: {values}"
    for r in rows:
        for key, value in r.items():
            if isinstance(value, float):
                assert math.isfinite(value), f"step {r['step']}: {key}={value}"
        assert 0.0 <= r["critic/score/mean"] <= 1.0
        assert 1.0 <= r["response_length/mean"] <= 12.0
        assert r["perf/throughput"] > 0 and r["timing_s/step"] >= r["timing_s/gen"] > 0
    summary = read_summary(run_dir / "summary.tsv")
    assert summary["steps"] == steps and summary["first_score"] == rows[0]["critic/score/mean"]
    assert (run_dir / "curves.png").read_bytes()[:4] == b"\x89PNG"
    return rows


def test_grpo_run_writes_finite_metrics_and_outputs(tmp_path, ray_head):
    # A finished run of the same experiment is already there: this one must say so and start anew.
    done = tmp_path / "outputs" / "grpo_tiny_arith_20260101_000000"
    done.mkdir(parents=True)
    (done / "run.json").write_text('{"status": "finished", "last_step": 60}')
    # Two steps: a metrics row per step, validation before training and at the last step.
    proc = _run("grpo_tiny", ["trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.save_freq=-1",
                              "trainer.profile_steps=[2]"], tmp_path, ray_address=ray_head)
    [out] = [d for d in (tmp_path / "outputs").iterdir() if d != done]
    rows = _check_outputs(out, 2, ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy",
                                   "timing_s/old_log_prob", "timing_s/update_actor", "timing_s/update_weights",
                                   "perf/max_memory_reserved_gb"))
    assert "critic/vf_loss" not in rows[0] and "timing_s/values" not in rows[0]
    assert isinstance(rows[-1]["val/score/mean"], float) and rows[0]["val/score/mean"] is None
    # Validation before training runs on the warm-started policy (~0.3 greedy accuracy), not on
    # the rollout copy's initial weights: a missing weight sync shows up as ~0 here.
    assert read_summary(out / "summary.tsv")["val_before_train"] > 0.1
    log = (out / "train.log").read_text()
    assert "finished 2 step(s)" in log
    # trainer.profile_steps=[2]: every rank's step 2 under torch.profiler, step 1 not.
    assert sorted(p.name for p in (out / "profile").iterdir()) == [
        f"step2_rank{r}.{ext}" for r in (0, 1) for ext in ("trace.json", "txt")]
    for r in (0, 1):
        assert (out / "profile" / f"step2_rank{r}.txt").read_text().startswith(f"step 2, rank {r}:")
    assert f"step 2 profiled: {out / 'profile' / 'step2_rank0.txt'}" in log
    # What it continues or not, and its setup, on the console and in train.log alike.
    for text in (proc.stderr, log):
        assert f"the previous run of this experiment finished (60 steps) in {done}; this is a new run in {out}" in text
        assert "setup: DeepSpeed engine (deepspeed), grpo, 2 CPU rank(s) on 1 node(s)" in text
        assert ("actor: ZeRO-2, offload (read back) optimizer=device param=device, dp 2 x sp 1, micro 8 x GAS 1 "
                "per rank, 2 mini-batch(es) x 2 epoch(s)/step, remove-padding off, LoRA off") in text
        assert "rollout: hf, 8 prompts x n=4" in text
    assert "Token authentication" not in proc.stderr


def test_ppo_run_trains_actor_and_critic(tmp_path, ray_head):
    out = tmp_path / "ppo"
    proc = _run("ppo_tiny", ["trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.save_freq=-1",
                             "critic.ppo_mini_batch_size=4", "critic.ppo_micro_batch_size_per_gpu=8",
                             "critic.forward_micro_batch_size_per_gpu=16", f"trainer.output_dir={out}"], tmp_path,
                ray_address=ray_head)
    assert "critic: ZeRO-2, offload (read back) optimizer=device param=device, dp 2 x sp 1" in proc.stderr
    _check_outputs(out, 2, ("actor/pg_loss", "critic/vf_loss", "critic/values/mean", "critic/returns/mean",
                            "critic/grad_norm", "timing_s/values", "timing_s/update_critic", "perf/mfu/critic"))


def _wait_for_checkpoint(proc: subprocess.Popen, marker: Path, step: int, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if marker.is_file() and marker.read_text().strip() == str(step):
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended (rc {proc.returncode}) before its step-{step} checkpoint")
        time.sleep(0.2)
    raise AssertionError(f"no step-{step} checkpoint within {timeout} s")
