"""Benchmark case command lines, crossover comparisons, collecting earlier outputs and the bad-argument
exits (no runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.bench.__main__ import _parser, main
from repro.bench.rl_cases import SIX_CASES, case_command, case_env, crossover_cases, crossover_comparisons
from repro.bench.summary import SUMMARY_COLUMNS, case_row, read_tsv, write_tsv
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
    ["crossover", "--step-modes", "0", "--cases", "zero2_sem1"],
    ["crossover", "--collect", "no_such_dir"],
])
def test_bad_arguments_exit_2_with_one_line_naming_the_option(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --")


def _earlier_output(root: Path, seed: int, scores: dict[str, float]) -> Path:
    """What ``crossover --seeds <seed>`` leaves: summary.tsv and each case's metrics.tsv."""
    out = root / f"seed{seed}_run"
    rows = []
    for case, score in scores.items():
        (out / case).mkdir(parents=True)
        (out / case / "metrics.tsv").write_text(f"step\tcritic/score/mean\n1\t{score}\n")
        rows.append(case_row(case, seed, [{"step": 1, "critic/score/mean": score, "perf/throughput": 10.0 * seed}],
                             status="ok", retries=0, wall_s=1.0, extra={"zero_stage": int(case[4]),
                                                                       "step_each_micro": "0"}))
    write_tsv(out / "summary.tsv", SUMMARY_COLUMNS, rows)
    return out


def test_crossover_collects_one_seed_per_earlier_command_into_paired_deltas_over_seeds(tmp_path):
    a = _earlier_output(tmp_path, 1, {"zero1_sem0": 0.5, "zero2_sem0": 0.75})
    b = _earlier_output(tmp_path, 2, {"zero1_sem0": 0.25, "zero2_sem0": 0.375})
    argv = ["crossover", "--seeds", "1,2", "--step-modes", "0", "--outputs-root", str(tmp_path / "out"),
            "--run-tag", "both", "--collect", str(a), str(b)]
    assert main(argv) == 0
    (out,) = (tmp_path / "out").iterdir()
    assert [(r["case"], r["seed"]) for r in read_tsv(out / "summary.tsv")] == [
        ("zero1_sem0", "1"), ("zero2_sem0", "1"), ("zero1_sem0", "2"), ("zero2_sem0", "2")]
    deltas = {r["seed"]: float(r["delta_score"]) for r in read_tsv(out / "compare.tsv")}
    assert deltas == {"1": 0.25, "2": 0.125}
    score = next(r for r in read_tsv(out / "overall.tsv") if r["metric"] == "score")
    assert score["n_seeds"] == "2" and float(score["mean_delta"]) == 0.1875


def test_collect_refuses_a_run_found_twice_or_missing_with_one_line(tmp_path, capsys):
    a = _earlier_output(tmp_path, 1, {"zero1_sem0": 0.5, "zero2_sem0": 0.75})
    base = ["crossover", "--step-modes", "0", "--outputs-root", str(tmp_path / "out")]
    assert main([*base, "--seeds", "1", "--collect", str(a), str(a)]) == 2
    assert "zero1_sem0 seed 1 is in both" in capsys.readouterr().err
    assert main([*base, "--seeds", "1,2", "--collect", str(a)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no row for zero1_sem0 seed 2, zero2_sem0 seed 2" in err[0]
    assert not (tmp_path / "out").exists()


def test_crossover_cases_picks_a_subset_of_the_step_modes_cases():
    from repro.bench.__main__ import _plan
    cases, seeds, _ = _plan(_parser().parse_args(["crossover", "--seeds", "2", "--step-modes", "0",
                                                  "--cases", "zero2_sem0"]))
    assert [c.name for c in cases] == ["zero2_sem0"] and seeds == [2]
