"""``scripts/seed_scale.sh``: the device runs' phases compose, on CPU, into the configs they claim.

A key misspelt in a phase costs a device session (minutes of a lent GPU machine and its set-up); here
each phase that builds a ``repro.main_ppo`` command runs it as a dry run (``trainer.dry_run=true``,
passed through as one of the phase's extra keys) and the printed plan is read back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.seed_scale_phase import run_phase


def _phase(tmp_path: Path, *args: str, **env_vars: str) -> tuple[dict, str]:
    proc, out = run_phase(tmp_path, *args, "trainer.dry_run=true", timeout=120, **env_vars)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (log,) = out.glob("*.log")
    text = log.read_text()
    plan = json.loads(next(line for line in reversed(text.splitlines()) if line.startswith("{")))
    return plan, text


@pytest.mark.parametrize("sp", [1, 2])
def test_the_four_gpu_phase_is_the_seeds_layout_with_the_log_prob_pass_at_the_update_micro_batch(tmp_path, sp):
    plan, text = _phase(tmp_path, "four", "2", str(sp), "20")
    batch, rollout = plan["batch"]["actor"], plan["config"]["actor_rollout_ref"]["rollout"]
    assert (batch["world"], batch["sp"], batch["dp"], batch["micro"]) == (4, sp, 4 // sp, 16)
    assert plan["actor"]["deepspeed"]["train_batch_size"] == 512  # 128 prompts x n=4: micro x GAS x dp
    assert rollout["log_prob_micro_batch_size_per_gpu"] == 16 and not rollout["log_prob_use_dynamic_bsz"]
    assert "log-prob pass" not in text  # the loader's warning of results/4gpu's first runs


def test_the_sp_phase_is_the_preset_at_sp_on_two_gpus(tmp_path):
    plan, _ = _phase(tmp_path, "sp", "2", "2", "10")
    batch = plan["batch"]["actor"]
    assert (batch["world"], batch["sp"], batch["dp"]) == (2, 2, 1)
    assert plan["config"]["trainer"]["total_training_steps"] == 10


def test_a_named_four_gpu_variant_gets_its_own_run_folder(tmp_path):
    """A LoRA run beside the plain one: its own folder and log, not the plain run's checkpoint to resume."""
    plan, _ = _phase(tmp_path, "four", "2", "2", "20", "actor_rollout_ref.model.lora_rank=8",
                     RUN_NAME="four_lora8_zero2_sp2")
    assert plan["config"]["trainer"]["output_dir"] == str(tmp_path / "routs" / "four_lora8_zero2_sp2")
    assert plan["config"]["actor_rollout_ref"]["model"]["lora_rank"] == 8
    assert [p.name for p in (tmp_path / "out").glob("*.log")] == ["four_lora8_zero2_sp2.log"]


def test_background_jobs_run_in_order_from_a_private_copy_and_poll_brings_back_their_files(tmp_path):
    """The third 4-GPU lease lost verl's run when a later device call refreshed the tree it imported from
    (results/4gpu/README.md): ``bg`` runs a phase from a copy of the tree, after the jobs it names."""
    import tarfile

    plan = tmp_path / "plan"
    first, _ = run_phase(tmp_path, "bg", "first", "no-such-phase", PLAN_DIR=str(plan))
    second, _ = run_phase(tmp_path, "bg", "second", "after=first", "no-such-phase-either", PLAN_DIR=str(plan))
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert "bg second started after first" in second.stdout
    proc, out = run_phase(tmp_path, "poll", "60", PLAN_DIR=str(plan))
    assert proc.returncode == 0, proc.stderr
    assert "first: rc=2 |" in proc.stdout and "second: rc=2 |" in proc.stdout  # each phase's usage error
    tree = plan / "tree"
    assert (tree / "scripts" / "seed_scale.sh").is_file() and not (tree / ".git").exists()
    log = (plan / "second.log").read_text().splitlines()
    assert log[0].endswith(f"second from {tree}: no-such-phase-either")
    assert (plan / "first.rc").stat().st_mtime <= (plan / "second.rc").stat().st_mtime
    with tarfile.open(out / "plan.tar.gz") as tar:
        names = tar.getnames()
    assert {"first.log", "second.rc"} <= set(names) and not any(n.startswith("tree") for n in names)


def test_poll_brings_back_the_runs_logged_steps_so_far_without_their_checkpoints(tmp_path):
    """The sixth 4-GPU lease lost a verl run at step 13 with its machine, and every step it had logged with it:
    each poll now brings the runs' small files back as they stand."""
    import tarfile

    run = tmp_path / "routs" / "vfour_zero2_sp2"
    (run / "checkpoints" / "global_step_10").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 13}\n')
    (run / "checkpoints" / "global_step_10" / "state.json").write_text("{}")
    (run / "big.bin").write_bytes(b"\0" * (3 << 20))  # over the 2 MB bound: weights, not a log
    proc, out = run_phase(tmp_path, "poll", "1", PLAN_DIR=str(tmp_path / "plan"))
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(out / "outputs.tar.gz") as tar:
        names = {n.removeprefix("./") for n in tar.getnames() if tar.getmember(n).isfile()}
    assert names == {"vfour_zero2_sp2/metrics.jsonl"}, names


def test_a_device_script_runs_as_a_background_phase_from_the_private_copy_with_its_own_out(tmp_path):
    """Session 14 ran a device script in the background by hand and it died when the next call replaced its folder;
    ``script`` makes it a phase, so ``bg`` runs it from the copy and chains it with the runs."""
    plan, probe = tmp_path / "plan", tmp_path / "probe.sh"
    probe.write_text('echo "$PWD|$OUT|$*|$CUDA_VISIBLE_DEVICES" > "$OUT/where.txt"\n')
    started, _ = run_phase(tmp_path, "bg", "s", "script", str(probe), "a", "b", PLAN_DIR=str(plan), GPUS="3")
    assert started.returncode == 0, started.stderr
    proc, _ = run_phase(tmp_path, "poll", "60", PLAN_DIR=str(plan))
    assert "s: rc=0 |" in proc.stdout, proc.stdout
    assert (plan / "s" / "where.txt").read_text().strip() == f"{plan / 'tree'}|{plan / 's'}|a b|3"
    assert (plan / "s" / "probe.log").is_file()


def test_a_script_phase_without_its_file_is_one_line_and_exit_2(tmp_path):
    proc, _ = run_phase(tmp_path, "script", "results/no_such_device.sh")
    assert proc.returncode == 2 and proc.stderr.strip().startswith("script: results/no_such_device.sh is not a file")
