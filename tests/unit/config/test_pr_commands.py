"""The seed PR's verl command lines (``tests/pr_commands.py``) build the configs they name, in dry runs."""

from __future__ import annotations

import pytest

from repro.config import critic_enabled, ref_policy_used
from tests.unit.config.loading import PR_COMMANDS, SHELL_VARS, ZERO3, built, dry


def test_fixtures_hold_every_pr_command():
    names = {c.name for c in PR_COMMANDS}
    six = {f"zero{s}_{o}_offload" for s in (1, 2, 3) for o in ("no", "cpu")}
    assert six | {"minimal_demo", "grpo_fix_60", "bench_zero3_cpu_offload", "older_form_aliases"} <= names
    assert all(c.env.get("VERL_DS_ZERO2_FP32_ACCUM_PATCH") == "1" for c in PR_COMMANDS if c.name in six)
    assert [c.name for c in PR_COMMANDS if "VERL_ENABLE_PARAM_OFFLOAD" in c.env] == [
        "bench_zero3_cpu_offload",
        "zero3_cpu_offload",
    ]


@pytest.mark.parametrize("cmd", PR_COMMANDS, ids=lambda c: c.name)
def test_pr_command_builds_a_config_in_a_dry_run(cmd):
    overrides = cmd.expanded(SHELL_VARS)
    if cmd.expect_error:
        with pytest.raises(ValueError, match=cmd.expect_error):
            dry(overrides, cmd.env)
        return
    cfg, notes = built(cmd)
    stage = next(
        int(o.rsplit("=", 1)[1])
        for o in overrides
        if o.startswith("actor_rollout_ref.actor.deepspeed.zero_stage=")
    )
    assert cfg.actor_rollout_ref.actor.deepspeed.zero_stage == stage
    for ds in (cfg.actor_rollout_ref.actor.deepspeed, cfg.critic.deepspeed_config):
        assert ds.fp32_grad_accum is (cmd.env.get("VERL_DS_ZERO2_FP32_ACCUM_PATCH") == "1")
        assert ds.step_each_micro is (cmd.env.get("VERL_DS_ZERO2_STEP_EACH_MICRO") == "1")
        assert ds.param_offload is (cmd.env.get("VERL_ENABLE_PARAM_OFFLOAD") == "1")
    assert any("Qwen/Qwen3-0.6B" in n and "(a real run fails here)" in n for n in notes)


def test_pr_commands_set_the_keys_they_name():
    cfg, _ = built(ZERO3)
    arr = cfg.actor_rollout_ref
    assert (arr.actor.deepspeed.offload, cfg.critic.deepspeed_config.offload) == ("cpu", "cpu")
    assert (arr.actor.ppo_mini_batch_size, arr.actor.ppo_micro_batch_size_per_gpu) == (32, 2)
    assert (cfg.critic.ppo_max_token_len_per_gpu, cfg.data.train_batch_size) == (2048, 64)
    assert (arr.rollout.name, arr.rollout.gpu_memory_utilization, cfg.trainer.logger) == (
        "vllm",
        0.2,
        ["console"],
    )
    assert cfg.data.train_files == "/nonexistent/train.parquet"
    assert critic_enabled(cfg) and not ref_policy_used(cfg)
    # 60 RL steps x 2 mini-batches (64 prompts / 32) x 1 epoch optimizer steps.
    assert arr.actor.optim.total_training_steps == cfg.critic.optim.total_training_steps == 120


def test_grpo_command_takes_plus_reward_kwargs_and_disables_the_critic():
    grpo = next(c for c in PR_COMMANDS if c.name == "grpo_fix_60")
    cfg, _ = built(grpo)
    assert cfg.reward.reward_kwargs == {"method": "flexible", "format_score": 0.1, "score": 1.0}
    assert not critic_enabled(cfg) and cfg.actor_rollout_ref.rollout.n == 4


def test_bench_extras_ray_temp_dir_and_override_config_are_accepted():
    bench = next(c for c in PR_COMMANDS if c.name == "bench_zero3_cpu_offload")
    cfg, _ = built(bench)
    assert cfg.ray_kwargs.ray_init == {"_temp_dir": "/tmp/repro-bench/ray"}
    assert cfg.actor_rollout_ref.model.override_config == {"attn_implementation": "flash_attention_2"}
    assert cfg.actor_rollout_ref.ref.deepspeed.offload == "cpu" and cfg.data.seed == 7777
