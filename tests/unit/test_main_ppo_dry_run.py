"""``python -m repro.main_ppo ... trainer.dry_run=true``: the printed plan, its JSON, exit codes, messages."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import warnings

import pytest

from repro.batching.plan import RoleBatchPlan
from repro.config import DeepSpeedConfig, OptimConfig
from repro.config.ds_config import build_ds_config
from repro.main_ppo import main, parse_argv
from tests.pr_commands import all_pr_commands
from tests.subprocess_env import pythonpath

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMMANDS = {c.name: c for c in all_pr_commands()}
SHELL_VARS = {
    "DATA_TRAIN": "/nonexistent/train.parquet",
    "DATA_VAL": "/nonexistent/val.parquet",
    "BENCH_DIR": "/tmp/repro-bench",
}
KNOBS = ("VERL_ENABLE_PARAM_OFFLOAD", "VERL_DS_ZERO2_FP32_ACCUM_PATCH", "VERL_DS_ZERO2_STEP_EACH_MICRO")


def run_main(argv, monkeypatch, capsys, env=None):
    for knob in KNOBS:
        monkeypatch.delenv(knob, raising=False)
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def dry_run(name, monkeypatch, capsys, env=None, extra=()):
    cmd = COMMANDS[name]
    argv = [
        "-cn",
        "ppo_trainer",
        *cmd.expanded(SHELL_VARS),
        *extra,
        "trainer.dry_run=true",
        "trainer.device=cpu",
    ]
    code, out, err = run_main(argv, monkeypatch, capsys, cmd.env if env is None else env)
    assert code == 0, err
    return json.loads(out.strip().splitlines()[-1]), out, err


@pytest.mark.parametrize("param_offload", [True, False])
def test_zero3_cpu_offload_plan_offloads_params_only_with_the_env_knob(param_offload, monkeypatch, capsys):
    env = dict(COMMANDS["zero3_cpu_offload"].env)
    if not param_offload:
        del env["VERL_ENABLE_PARAM_OFFLOAD"]
    plan, out, _ = dry_run("zero3_cpu_offload", monkeypatch, capsys, env=env)
    for role in ("actor", "critic"):
        zero = plan[role]["deepspeed"]["zero_optimization"]
        assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu"
        assert ("offload_param" in zero) is param_offload
        assert plan[role]["deepspeed"]["train_batch_size"] == 32
        assert plan[role]["deepspeed"]["train_micro_batch_size_per_gpu"] == 2
        assert plan[role]["deepspeed"]["gradient_accumulation_steps"] == 8
        assert plan["batch"][role] == {
            "world": 2,
            "dp": 2,
            "sp": 1,
            "samples_per_step": 64,
            "mini_batch_samples": 32,
            "per_rank_mini": 16,
            "micro": 2,
            "gas": 8,
            "train_batch_size": 32,
            "num_mini_batches": 2,
            "dynamic": False,
            "max_token_len": None,
        }
    assert plan["ref"] == {"enabled": False, "deepspeed": None}
    assert plan["env_knobs"] == {
        "VERL_ENABLE_PARAM_OFFLOAD": param_offload,
        "VERL_DS_ZERO2_FP32_ACCUM_PATCH": True,
        "VERL_DS_ZERO2_STEP_EACH_MICRO": False,
    }
    assert any("vllm" in w for w in plan["warnings"])
    assert "actor: ZeRO-3, offload optimizer=cpu param=" + ("cpu" if param_offload else "none") in out


def test_dry_run_json_is_exactly_what_build_ds_config_gives(monkeypatch, capsys):
    from repro.config.loader import ConfigWarning, load_config
    from repro.config.rules import plan_role_batch

    cmd = COMMANDS["zero2_cpu_offload"]
    plan, _, _ = dry_run("zero2_cpu_offload", monkeypatch, capsys)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        cfg = load_config([*cmd.expanded(SHELL_VARS), "trainer.dry_run=true"], environ=cmd.env)
    actor = cfg.actor_rollout_ref.actor
    assert plan["actor"]["deepspeed"] == build_ds_config(
        actor.deepspeed, actor.optim, plan_role_batch(cfg, "actor"), grad_clip=actor.grad_clip, on_cuda=False
    )
    assert plan["critic"]["deepspeed"] == build_ds_config(
        cfg.critic.deepspeed_config,
        cfg.critic.optim,
        plan_role_batch(cfg, "critic"),
        grad_clip=cfg.critic.grad_clip,
        on_cuda=False,
    )


def test_grpo_plan_has_no_critic_and_counts_rollout_samples(monkeypatch, capsys):
    plan, _, _ = dry_run("grpo_fix_60", monkeypatch, capsys)
    assert plan["critic"] == {"enabled": False, "deepspeed": None} and plan["batch"]["critic"] is None
    batch = plan["batch"]["actor"]
    assert (batch["mini_batch_samples"], batch["per_rank_mini"], batch["micro"], batch["gas"]) == (
        128,
        64,
        1,
        64,
    )
    assert plan["actor"]["deepspeed"]["train_batch_size"] == 128
    assert plan["env_knobs"] == dict.fromkeys(KNOBS, False)


def test_kl_loss_adds_a_frozen_reference_policy_and_zero1_offload_warns(monkeypatch, capsys):
    plan, _, _ = dry_run(
        "zero1_cpu_offload", monkeypatch, capsys, extra=["actor_rollout_ref.actor.use_kl_loss=True"]
    )
    ref = plan["ref"]["deepspeed"]
    assert ref["zero_optimization"]["stage"] == 3 and "optimizer" not in ref
    # What the reference worker's engine builds: the actor's plan and clip value, no optimizer.
    actor_plan = RoleBatchPlan(**plan["batch"]["actor"])
    assert ref == build_ds_config(
        DeepSpeedConfig(**plan["config"]["actor_rollout_ref"]["ref"]["deepspeed"]),
        OptimConfig(),
        actor_plan,
        grad_clip=plan["config"]["actor_rollout_ref"]["actor"]["grad_clip"],
        on_cuda=False,
        trainable=False,
    )
    # ZeRO-1 offloads the optimizer (unlike verl's seed; see ds_config.resolve_offload).
    assert plan["actor"]["deepspeed"]["zero_optimization"]["offload_optimizer"]["device"] == "cpu"


def test_bad_mini_batch_on_two_gpus_exits_nonzero_naming_the_key(monkeypatch, capsys):
    argv = [
        *COMMANDS["zero2_no_offload"].expanded(SHELL_VARS),
        "actor_rollout_ref.actor.ppo_mini_batch_size=33",
        "trainer.dry_run=true",
    ]
    code, out, err = run_main(argv, monkeypatch, capsys)
    assert code == 2 and out == ""
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=33" in err and "32 or 64" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_unknown_key_exits_nonzero_with_close_matches(monkeypatch, capsys):
    code, _, err = run_main(["critic.deepspeed.zero_stage=3", "trainer.dry_run=true"], monkeypatch, capsys)
    assert code == 2 and "unknown config key 'critic.deepspeed.zero_stage'" in err
    assert "critic.deepspeed_config.zero_stage" in err


def test_real_run_with_vllm_missing_fails_before_starting_anything(monkeypatch, capsys):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    code, _, err = run_main(["actor_rollout_ref.rollout.name=vllm"], monkeypatch, capsys)
    assert code == 2 and "use actor_rollout_ref.rollout.name=hf" in err


def test_argv_accepts_both_config_name_spellings():
    assert parse_argv(["-cn", "ppo_trainer", "a=1"])[:2] == ("ppo_trainer", ["a=1"])
    assert parse_argv(["--config-name=ppo_trainer", "a=1"])[:2] == ("ppo_trainer", ["a=1"])
    assert parse_argv(["--config-name", "x"])[0] == "x"
    with pytest.raises(ValueError, match="unknown option '--multirun'"):
        parse_argv(["--multirun"])


def test_cli_subprocess_prints_json_as_the_last_line(tmp_path):
    cmd = COMMANDS["zero3_cpu_offload"]
    env = {**os.environ, **cmd.env, "PYTHONPATH": pythonpath(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "repro.main_ppo",
            "--config-name",
            "ppo_trainer",
            *cmd.expanded(SHELL_VARS),
            "trainer.dry_run=true",
            "trainer.device=cpu",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout.strip().splitlines()[-1])
    assert plan["actor"]["deepspeed"]["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert list(tmp_path.iterdir()) == []  # no Hydra output directory


def test_lora_and_sequence_parallel_plan(monkeypatch, capsys):
    """older_form_sp2 (critic sp=2) with a LoRA actor and a KL loss: the reference is the actor's
    base model (no engine), and the SP role's DeepSpeed JSON counts data-parallel ranks only."""
    extra = ("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.actor.use_kl_loss=True")
    plan, out, _ = dry_run("older_form_sp2", monkeypatch, capsys, extra=extra)
    assert plan["ref"] == {"enabled": True, "in_actor": True, "deepspeed": None}
    assert "ref: the actor's base model with the LoRA adapters disabled" in out
    batch = plan["batch"]["critic"]
    assert batch["sp"] == 2 and batch["train_batch_size"] == batch["micro"] * batch["gas"] * batch["dp"] * 2
    assert plan["critic"]["deepspeed"]["train_batch_size"] == batch["micro"] * batch["gas"] * batch["dp"]


def test_help_names_the_configs_the_device_key_the_outputs_the_cache_and_the_gpu_gate(capsys):
    from repro.config.presets import PRESETS

    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    for name in [*PRESETS, "ppo_trainer"]:
        assert f"  {name} " in text, name
    for needle in ("trainer.device=auto|cpu|cuda", "trainer.dry_run=true", "metrics.tsv", "train.log",
                   "REPRO_CACHE_DIR", "REPRO_OUTPUTS_DIR", "nox -s gpu_e2e", "python -m repro.cluster.ray_reaper"):
        assert needle in text, needle
    gate = next(ln for ln in text.splitlines() if "scripts/gpu_e2e.sh" in ln)
    assert (ROOT / "scripts" / "gpu_e2e.sh").is_file(), gate
    assert max(len(ln) for ln in text.splitlines()) <= 100  # one terminal screen wide
