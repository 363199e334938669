"""``python -m repro.bench six-case|crossover`` end to end on CPU: real runs of the tiny GRPO.

Each case is a real ``repro.main_ppo`` run (Ray, 2 ranks, DeepSpeed) of one step with a smaller
batch and no validation or checkpoints: what is under test is the workflow (cases, retries,
placement, summaries, paired deltas), not the runs' figures. A forced
failure (``REPRO_BENCH_FAIL_FIRST``) makes one case's first attempt exit 2; the retry and its
count are in summary.tsv and the failed attempt's log stays in the case folder.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

from repro.bench.summary import COMPARE_COLUMNS, OVERALL_COLUMNS, SUMMARY_COLUMNS, read_tsv
from tests.subprocess_env import pythonpath

FAST = ["-cn", "grpo_tiny", "trainer.test_freq=0", "trainer.val_before_train=False", "trainer.save_freq=0",
        "data.train_batch_size=16"]
REPO = Path(__file__).resolve().parents[3]


def _bench(tmp_path: Path, args: list[str], ray_address: str,
           fail_first: str = "") -> tuple[subprocess.CompletedProcess, Path]:
    # Every case's job joins the worker's shared Ray head instead of starting a cluster of its own.
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONPATH=pythonpath(REPO),
               REPRO_BENCH_FAIL_FIRST=fail_first, RAY_ADDRESS=ray_address, REPRO_REUSE_RANKS="1")
    env.pop("VERL_DS_ZERO2_STEP_EACH_MICRO", None)
    cmd = [sys.executable, "-m", "repro.bench", *args, "--steps", "1", "--outputs-root", str(tmp_path),
           "--run-tag", "t", "--", *FAST]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (out,) = [p for p in tmp_path.iterdir() if p.name.startswith("t_")]
    return proc, out


def _check_row(row: dict[str, str]) -> None:
    assert row["status"] == "ok" and row["steps"] == "1"
    for col in ("first_score", "last_score", "avg_score_tail5", "avg_throughput_tail5", "max_memory_reserved_gb",
                "wall_s"):
        assert float(row[col]) >= 0.0, col
    assert float(row["avg_throughput_tail5"]) > 0


# Two of the six cases run here, one per distinct offload path: ZeRO-1's optimizer offload (whose
# first attempt is forced to fail, for the retry) and ZeRO-3 parameter offload through its
# environment knob. Every case's command line and config are checked in
# tests/unit/bench/test_rl_cases.py (with the default --cases being all six), and the placement each
# case gives real engines, all six, in tests/distributed/workers/test_placement.py: the other four
# would repeat a job each. The bench's reading of no offload ("device") is checked on the crossover's
# rows below (until 2026-11-27 a third case here, zero2_no_offload, which also carried the retry).
RUN_CASES = ["zero1_cpu_offload", "zero3_cpu_offload"]
FAIL_FIRST = "zero1_cpu_offload"


def test_six_case_runs_the_named_cases_reads_placement_and_records_a_retry(tmp_path, ray_head):
    proc, out = _bench(tmp_path, ["six-case", "--seed", "3", "--cases", ",".join(RUN_CASES)], ray_head,
                       fail_first=FAIL_FIRST)
    rows = {r["case"]: r for r in read_tsv(out / "summary.tsv")}
    assert list(read_tsv(out / "summary.tsv")[0]) == list(SUMMARY_COLUMNS)
    assert list(rows) == RUN_CASES
    for name, row in rows.items():
        _check_row(row)
        assert row["seed"] == "3" and (out / name / "train.log").is_file()
        assert row["retries"] == ("1" if name == FAIL_FIRST else "0")
        # Placement as read from the engines (ZeRO-1 + cpu does offload; params only at ZeRO-3 + param offload).
        assert row["optimizer_on"] == "cpu_offload"
        assert row["params_on"] == ("cpu_offload" if name == "zero3_cpu_offload" else "device")
    failed = out / FAIL_FIRST / "attempt1.log"
    assert "repro_bench_forced_failure" in failed.read_text() and "exit: 2" in failed.read_text()
    assert (out / "curves.png").is_file()
    assert sum(line.startswith("[") for line in proc.stdout.splitlines()) == len(RUN_CASES)


def test_crossover_two_seeds_writes_paired_deltas_and_noise_verdicts(tmp_path, ray_head):
    proc, out = _bench(tmp_path, ["crossover", "--seeds", "5 6", "--step-modes", "0"], ray_head)
    summary = read_tsv(out / "summary.tsv")
    assert [(r["case"], r["seed"]) for r in summary] == [("zero1_sem0", "5"), ("zero2_sem0", "5"),
                                                         ("zero1_sem0", "6"), ("zero2_sem0", "6")]
    for row in summary:
        _check_row(row)
        assert row["step_each_micro"] == "0" and row["retries"] == "0"
        # Placement as read from the engines: neither case offloads (the six-case test reads offload).
        assert (row["optimizer_on"], row["params_on"]) == ("device", "device")
        assert row["zero_stage"] == row["case"][len("zero")]
        assert (out / f"seed{row['seed']}" / row["case"] / "train.log").is_file()
    compare = read_tsv(out / "compare.tsv")
    assert list(compare[0]) == list(COMPARE_COLUMNS)
    by = {(r["case"], r["seed"]): r for r in summary}
    for row in compare:
        assert row["comparison"] == "z2-z1@sem0"
        want = float(by[("zero2_sem0", row["seed"])]["avg_score_tail5"]) - float(
            by[("zero1_sem0", row["seed"])]["avg_score_tail5"])
        # The TSVs print 6 significant digits (bench.summary._cell): three printed values differ from
        # the exact ones by at most half a unit of their 6th digit each.
        scale = max(abs(float(by[(c, row["seed"])]["avg_score_tail5"])) for c in ("zero1_sem0", "zero2_sem0"))
        assert abs(float(row["delta_score"]) - want) <= 1.5 * 10 ** (math.floor(math.log10(max(scale, 1e-12))) - 5)
    overall = read_tsv(out / "overall.tsv")
    assert list(overall[0]) == list(OVERALL_COLUMNS)
    assert {r["metric"] for r in overall} == {"score", "throughput", "memory_gb"}
    for row in overall:
        assert row["n_seeds"] == "2" and row["verdict"] in ("exceeds_noise", "within_noise")
    assert "z2-z1@sem0 score" in proc.stdout
