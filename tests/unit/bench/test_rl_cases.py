"""Benchmark case command lines, crossover comparisons and the bad-argument exits (no runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.bench.__main__ import _parser, main
from repro.bench.rl_cases import SIX_CASES, case_command, case_env, crossover_cases, crossover_comparisons
from repro.config.loader import load_config


def test_six_cases_configure_actor_and_critic_and_the_param_offload_knob():
    for case in SIX_CASES:
        cmd = case_command(case, ["-cn", "ppo_tiny"], steps=3, seed=9, out_dir=Path("/tmp/x"))
        overrides = cmd[cmd.index("ppo_tiny") + 1:]
        env = case_env(case, {})
        cfg = load_config(overrides, config_name="ppo_tiny", environ=env)
        assert f"actor_rollout_ref.actor.deepspeed.zero_stage={case.zero_stage}" in overrides
        assert f"critic.deepspeed_config.offload={case.offload}" in overrides
        assert {"trainer.total_training_steps=3", "trainer.seed=9", "data.seed=9", "trainer.output_dir=/tmp/x",
                "trainer.resume_mode=disable"} <= set(overrides)
        assert (env.get("VERL_ENABLE_PARAM_OFFLOAD") == "1") == (case.name == "zero3_cpu_offload")
        for ds in (cfg.actor_rollout_ref.actor.deepspeed, cfg.critic.deepspeed_config):
            assert (ds.zero_stage, ds.offload) == (case.zero_stage, case.offload)
            assert ds.param_offload == (case.name == "zero3_cpu_offload")


def test_six_case_runs_all_six_cases_unless_told_otherwise():
    assert _parser().parse_args(["six-case"]).cases.split(",") == [c.name for c in SIX_CASES]
    assert len(SIX_CASES) == 6


def test_crossover_cases_and_comparisons_per_step_mode():
    assert [c.name for c in crossover_cases([0])] == ["zero1_sem0", "zero2_sem0"]
    assert crossover_comparisons([0]) == [("z2-z1@sem0", "zero1_sem0", "zero2_sem0")]
    both = crossover_comparisons([0, 1])
    assert [c[0] for c in both] == ["z2-z1@sem0", "z2-z1@sem1", "sem1-sem0@zero1", "sem1-sem0@zero2"]
    assert {c.step_each_micro for c in crossover_cases([0, 1])} == {"0", "1"}


@pytest.mark.parametrize("argv", [
    ["six-case", "--cases", "zero4"],
    ["six-case", "--steps", "0"],
    ["crossover", "--step-modes", "2"],
    ["crossover", "--seeds", "a b"],
])
def test_bad_arguments_exit_2_with_one_line_naming_the_option(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --")
