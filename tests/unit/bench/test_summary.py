"""Benchmark summary math on hand-made metrics: tail means, case rows, paired deltas, noise verdict."""

from __future__ import annotations

import math
import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from repro.bench.summary import (
    COMPARE_COLUMNS,
    OVERALL_COLUMNS,
    SUMMARY_COLUMNS,
    case_row,
    noise_verdict,
    overall_rows,
    paired_deltas,
    read_tsv,
    tail_mean,
    write_tsv,
)

finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False)


def _rows(scores, throughputs=None, reserved=None):
    throughputs = throughputs or [100.0] * len(scores)
    reserved = reserved or [1.0] * len(scores)
    return [{"step": i + 1, "critic/score/mean": s, "perf/throughput": t, "perf/max_memory_reserved_gb": m}
            for i, (s, t, m) in enumerate(zip(scores, throughputs, reserved, strict=True))]


def _ok(case, seed, score, tput=100.0, mem=1.0):
    return {"case": case, "seed": seed, "status": "ok", "avg_score_tail5": score,
            "avg_throughput_tail5": tput, "max_memory_reserved_gb": mem}


def test_tail_mean_is_mean_of_last_five_finite_values():
    assert tail_mean([9.0, 9.0, 1.0, 2.0, 3.0, 4.0, 5.0]) == 3.0
    assert tail_mean([1.0, 2.0]) == 1.5
    assert tail_mean([9.0, 1.0, float("nan"), None, 3.0, float("inf")]) == 2.0
    assert tail_mean([]) is None
    assert tail_mean([float("nan")]) is None


@settings(max_examples=30, deadline=None)
@given(st.lists(finite, min_size=1, max_size=20))
def test_case_row_tail_and_extremes_follow_the_metric_rows(scores):
    row = case_row("zero2", 7, _rows(scores), status="ok", retries=0, wall_s=3.0)
    assert set(SUMMARY_COLUMNS[:13]) <= set(row)
    assert row["steps"] == len(scores)
    assert row["first_score"] == scores[0] and row["last_score"] == scores[-1]
    assert row["max_score"] == max(scores)
    assert math.isclose(row["avg_score_tail5"], statistics.fmean(scores[-5:]), rel_tol=1e-9, abs_tol=1e-9)
    assert row["avg_throughput_tail5"] == 100.0


def test_case_row_of_a_failed_run_has_status_and_no_figures():
    row = case_row("zero3", 1, [], status="failed", retries=1, wall_s=2.5)
    assert row["status"] == "failed" and row["retries"] == 1 and row["steps"] == 0
    assert row["avg_score_tail5"] is None and row["wall_s"] == 2.5


def test_paired_deltas_are_b_minus_a_per_seed_and_skip_failed_cases():
    rows = [_ok("zero1", 1, 0.5, 100.0, 2.0), _ok("zero2", 1, 0.7, 90.0, 1.5),
            _ok("zero1", 2, 0.4), {**_ok("zero2", 2, 0.9), "status": "failed"},
            _ok("zero1", 3, 0.1)]
    out = paired_deltas(rows, "zero1", "zero2", "z2-z1")
    assert [r["seed"] for r in out] == [1, 2]  # seed 3 lacks zero2
    assert math.isclose(out[0]["delta_score"], 0.2)
    assert out[0]["delta_throughput"] == -10.0 and out[0]["delta_memory_gb"] == -0.5
    assert out[1]["b_status"] == "failed" and out[1]["delta_score"] is None


def test_noise_verdict_cases():
    assert noise_verdict([])["verdict"] == "no_data"
    assert noise_verdict([None, float("nan")])["verdict"] == "no_data"
    one = noise_verdict([0.3])
    assert one["verdict"] == "unknown" and one["mean_delta"] == 0.3 and one["se_delta"] is None
    assert noise_verdict([1.0, 1.1, 0.9])["verdict"] == "exceeds_noise"
    assert noise_verdict([1.0, -1.0, 0.1])["verdict"] == "within_noise"


@settings(max_examples=50, deadline=None)
@given(st.lists(finite, min_size=2, max_size=12))
def test_noise_verdict_is_two_standard_errors(deltas):
    out = noise_verdict(deltas)
    mean, sd = statistics.fmean(deltas), statistics.stdev(deltas)
    se = sd / math.sqrt(len(deltas))
    assert out["n_seeds"] == len(deltas)
    assert math.isclose(out["mean_delta"], mean, rel_tol=1e-9, abs_tol=1e-9)
    expected = "exceeds_noise" if abs(mean) > 2 * se else "within_noise"
    # Skip the knife edge where float rounding decides.
    if not math.isclose(abs(mean), 2 * se, rel_tol=1e-9, abs_tol=1e-12):
        assert out["verdict"] == expected


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(finite, finite), min_size=1, max_size=6), finite)
def test_overall_verdict_flips_with_a_constant_shift(pairs, shift):
    # A shift much larger than the spread of the deltas exceeds the noise once there are 2+ seeds.
    rows = []
    for seed, (base, noise) in enumerate(pairs):
        rows += [_ok("a", seed, base), _ok("b", seed, base + 1e4 + noise * 1e-3)]
    compare = paired_deltas(rows, "a", "b", "b-a")
    overall = {r["metric"]: r for r in overall_rows(compare)}
    assert set(overall) == {"score", "throughput", "memory_gb"}
    assert overall["score"]["verdict"] == ("unknown" if len(pairs) == 1 else "exceeds_noise")
    # Throughput and memory were identical in a and b: zero deltas never exceed the noise.
    assert overall["throughput"]["verdict"] in ("unknown", "within_noise")


def test_tsv_round_trip_keeps_columns_and_empty_cells(tmp_path):
    rows = [_ok("zero1", 1, 0.5), _ok("zero2", 1, 0.25)]
    compare = paired_deltas(rows, "zero1", "zero2", "z2-z1")
    write_tsv(tmp_path / "compare.tsv", COMPARE_COLUMNS, compare)
    write_tsv(tmp_path / "overall.tsv", OVERALL_COLUMNS, overall_rows(compare))
    back = read_tsv(tmp_path / "compare.tsv")
    assert list(back[0]) == list(COMPARE_COLUMNS)
    assert float(back[0]["delta_score"]) == -0.25
    over = read_tsv(tmp_path / "overall.tsv")
    assert over[0]["verdict"] == "unknown" and over[0]["sd_delta"] == ""
