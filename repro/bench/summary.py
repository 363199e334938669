"""Benchmark summary math: case rows, paired deltas between cases, and a noise verdict over seeds.

A benchmark case is one training run (one ZeRO case, one seed). Its row holds the run's headline
figures, computed by :func:`repro.rl.metrics.summarize` from its ``metrics.tsv`` so the benchmark and a
plain run agree on what ``avg_score_tail5`` means (mean of the last five finite values). Two cases
of the same seed are compared as paired deltas (``b - a``, e.g. ZeRO-2 minus ZeRO-1): pairing by
seed removes the seed's own effect on the score. Over seeds, a mean delta is called
``exceeds_noise`` when it is more than two standard errors from zero, ``within_noise`` otherwise;
one seed gives ``unknown`` (no spread to compare with) and no finite delta gives ``no_data``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from repro.rl.metrics import TAIL, summarize

# summary.tsv: one row per case and seed.
SUMMARY_COLUMNS = (
    "case", "seed", "status", "retries", "steps", "first_score", "max_score", "last_score",
    "avg_score_tail5", "avg_throughput_tail5", "max_memory_reserved_gb", "max_memory_allocated_gb",
    "wall_s", "optimizer_on", "params_on", "zero_stage", "step_each_micro",
)
# The metrics compared between two cases, with the summary column each one reads.
DELTA_METRICS = {
    "score": "avg_score_tail5",
    "throughput": "avg_throughput_tail5",
    "memory_gb": "max_memory_reserved_gb",
}
COMPARE_COLUMNS = ("seed", "comparison", "a", "b", "a_status", "b_status",
                   *(f"delta_{m}" for m in DELTA_METRICS))
OVERALL_COLUMNS = ("comparison", "metric", "n_seeds", "mean_delta", "sd_delta", "se_delta", "verdict")
NOISE_SE = 2.0
"""A mean delta further than this many standard errors from zero exceeds the seed-to-seed noise."""


def tail_mean(values: Iterable[Any], tail: int = TAIL) -> float | None:
    """Mean of the finite numbers among the last ``tail`` values (None if there are none)."""
    last = list(values)[-tail:] if tail > 0 else []
    finite = [float(v) for v in last if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def case_row(case: str, seed: int, rows: Sequence[Mapping[str, Any]], *, status: str, retries: int,
             wall_s: float | None, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The summary.tsv row of one case run from its metric rows (empty rows: a run that failed)."""
    s = summarize(list(rows), wall_s=wall_s) if rows else {"steps": 0, "wall_s": wall_s}
    out: dict[str, Any] = {"case": case, "seed": seed, "status": status, "retries": retries}
    for col in SUMMARY_COLUMNS[4:13]:
        out[col] = s.get(col)
    out.update(extra or {})
    return out


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def paired_deltas(rows: Sequence[Mapping[str, Any]], a: str, b: str, comparison: str) -> list[dict[str, Any]]:
    """One compare.tsv row per seed that has both cases: ``b - a`` of each metric (None if missing).

    A failed case keeps its row (its status says so) but contributes no delta.
    """
    by_key = {(r["case"], r["seed"]): r for r in rows}
    out = []
    for seed in sorted({r["seed"] for r in rows}):
        ra, rb = by_key.get((a, seed)), by_key.get((b, seed))
        if ra is None or rb is None:
            continue
        row: dict[str, Any] = {"seed": seed, "comparison": comparison, "a": a, "b": b,
                               "a_status": ra["status"], "b_status": rb["status"]}
        ok = ra["status"] == "ok" and rb["status"] == "ok"
        for metric, col in DELTA_METRICS.items():
            va, vb = _num(ra.get(col)), _num(rb.get(col))
            row[f"delta_{metric}"] = vb - va if ok and va is not None and vb is not None else None
        out.append(row)
    return out


def noise_verdict(deltas: Iterable[Any]) -> dict[str, Any]:
    """Mean, spread and verdict of per-seed deltas (non-finite and missing ones are left out)."""
    vals = [v for v in (_num(d) for d in deltas) if v is not None]
    n = len(vals)
    if n == 0:
        return {"n_seeds": 0, "mean_delta": None, "sd_delta": None, "se_delta": None, "verdict": "no_data"}
    mean = sum(vals) / n
    if n == 1:
        return {"n_seeds": 1, "mean_delta": mean, "sd_delta": None, "se_delta": None, "verdict": "unknown"}
    sd = statistics.stdev(vals)
    se = sd / math.sqrt(n)
    verdict = "exceeds_noise" if abs(mean) > NOISE_SE * se else "within_noise"
    return {"n_seeds": n, "mean_delta": mean, "sd_delta": sd, "se_delta": se, "verdict": verdict}


def overall_rows(compare: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One overall.tsv row per comparison and metric: the verdict over seeds."""
    out = []
    for comparison in dict.fromkeys(r["comparison"] for r in compare):
        mine = [r for r in compare if r["comparison"] == comparison]
        for metric in DELTA_METRICS:
            out.append({"comparison": comparison, "metric": metric,
                        **noise_verdict(r[f"delta_{metric}"] for r in mine)})
    return out


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def write_tsv(path: str | Path, columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> None:
    """A header line and one tab-separated line per row (missing values empty)."""
    lines = ["\t".join(columns)] + ["\t".join(_cell(r.get(c)) for c in columns) for r in rows]
    Path(path).write_text("\n".join(lines) + "\n")


# summary.tsv columns that hold text or whole numbers; every other column is a float.
_TEXT_COLUMNS = ("case", "status", "optimizer_on", "params_on", "step_each_micro")
_INT_COLUMNS = ("seed", "retries", "steps", "zero_stage")


def parse_summary_row(row: Mapping[str, str]) -> dict[str, Any]:
    """A summary.tsv row read back as :func:`case_row` made it (empty cells: None), so rows of
    earlier benchmark runs can be compared as if this run had made them."""
    out: dict[str, Any] = {}
    for col, text in row.items():
        if text == "":
            out[col] = None
        elif col in _TEXT_COLUMNS:
            out[col] = text
        elif col in _INT_COLUMNS:
            out[col] = int(text)
        else:
            out[col] = float(text)
    return out


def read_tsv(path: str | Path) -> list[dict[str, str]]:
    """Rows of a TSV written by :func:`write_tsv`, as strings keyed by column."""
    lines = Path(path).read_text().splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:] if line]
