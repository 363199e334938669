"""metrics.tsv append/resume semantics, summary figures and the curves file."""

from __future__ import annotations

import math

import pytest

from repro.rl.metrics import (
    MetricsLog,
    plot_curves,
    read_summary,
    reduce_rank_metrics,
    summarize,
    write_summary,
)


def _row(step: int, score: float, **extra: float) -> dict:
    return {"step": step, "critic/score/mean": score, "perf/throughput": 100.0 + step, **extra}


def test_rows_survive_reopen_and_truncate_keeps_rows_up_to_checkpoint(tmp_path):
    log = MetricsLog(tmp_path / "metrics.tsv")
    for s in range(1, 6):
        log.append(_row(s, s / 10))
    again = MetricsLog(tmp_path / "metrics.tsv")
    assert [r["step"] for r in again.rows] == [1, 2, 3, 4, 5]
    assert again.truncate_after(3) == 2
    again.append(_row(4, 0.99))
    final = MetricsLog(tmp_path / "metrics.tsv")
    assert [r["step"] for r in final.rows] == [1, 2, 3, 4]
    assert final.rows[-1]["critic/score/mean"] == 0.99


def test_a_resume_rewrite_keeps_the_kept_rows_byte_for_byte_and_a_plain_files_mode(tmp_path):
    path = tmp_path / "metrics.tsv"
    log = MetricsLog(path)
    for s in range(1, 5):
        log.append(_row(s, s / 3, **{"perf/total_num_tokens": 5398 + s}))
    before = path.read_text().splitlines()
    with open(tmp_path / "plain", "w"):
        pass
    assert MetricsLog(path).truncate_after(2) == 2
    assert path.read_text().splitlines() == before[:3]
    assert path.stat().st_mode & 0o777 == (tmp_path / "plain").stat().st_mode & 0o777


def test_new_key_widens_header_and_keeps_earlier_rows(tmp_path):
    log = MetricsLog(tmp_path / "metrics.tsv")
    log.append(_row(1, 0.1))
    log.append(_row(2, 0.2, **{"val/score/mean": 0.5}))
    log.append(_row(3, 0.3))
    back = MetricsLog(tmp_path / "metrics.tsv")
    assert back.columns[-1] == "val/score/mean"
    assert back.rows[0]["val/score/mean"] is None and back.rows[1]["val/score/mean"] == 0.5
    assert [r["critic/score/mean"] for r in back.rows] == [0.1, 0.2, 0.3]


def test_partial_last_row_from_a_kill_is_dropped(tmp_path):
    path = tmp_path / "metrics.tsv"
    log = MetricsLog(path)
    log.append(_row(1, 0.1))
    with open(path, "a") as f:
        f.write("2\t0.2")  # cut short
    assert [r["step"] for r in MetricsLog(path).rows] == [1]


def test_summary_reports_first_max_last_and_tail_means(tmp_path):
    rows = [_row(s, s / 10, **{"perf/max_memory_reserved_gb": float(s)}) for s in range(1, 9)]
    summary = summarize(rows, wall_s=12.345)
    assert summary["steps"] == 8 and summary["first_score"] == 0.1 and summary["last_score"] == 0.8
    assert summary["max_score"] == 0.8
    assert math.isclose(summary["avg_score_tail5"], (0.4 + 0.5 + 0.6 + 0.7 + 0.8) / 5)
    assert math.isclose(summary["avg_throughput_tail5"], 106.0)
    assert summary["max_memory_reserved_gb"] == 8.0
    write_summary(tmp_path / "summary.tsv", summary)
    back = read_summary(tmp_path / "summary.tsv")
    assert back["steps"] == 8.0 and back["wall_s"] == 12.35


def test_nonfinite_losses_are_counted():
    rows = [_row(1, 0.1, **{"actor/pg_loss": float("nan")}), _row(2, 0.2, **{"actor/pg_loss": 0.3})]
    assert summarize(rows)["nonfinite_loss_steps"] == 1


def test_rank_reduction_takes_max_of_peaks_and_mean_of_the_rest():
    out = reduce_rank_metrics([{"perf/max_memory_reserved_gb": 1.0, "actor/pg_loss": 1.0},
                               {"perf/max_memory_reserved_gb": 3.0, "actor/pg_loss": 2.0}])
    assert out == {"perf/max_memory_reserved_gb": 3.0, "actor/pg_loss": 1.5}


def test_curves_png_is_written(tmp_path):
    rows = [_row(s, s / 10, **{"actor/pg_loss": 0.1 * s}) for s in range(1, 4)]
    plot_curves(rows, tmp_path / "curves.png", title="t")
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_row_without_step_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="step"):
        MetricsLog(tmp_path / "m.tsv").append({"critic/score/mean": 1.0})


def test_progress_bar_mode_reports_without_error(capsys):
    from repro.rl.metrics import StepReporter

    reporter = StepReporter(total=2, start=0, mode="bar")
    reporter.update(1, 2, {**_row(1, 0.25), "timing_s/step": 1.0, "val/score/mean": 0.5})
    reporter.close()
    assert "score=0.250" in capsys.readouterr().err
