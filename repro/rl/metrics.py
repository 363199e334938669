"""Per-step metrics of a run and the files they go to: metrics.tsv, summary.tsv, curves.png.

Names follow verl (``critic/score/mean``, ``perf/throughput``, ``timing_s/gen`` ...). The TSV is
appended and flushed row by row so a killed run keeps every finished step; a resumed run first
drops the rows after its checkpoint step (they are recomputed) and keeps the rest once. The
columns are fixed by the first row; a key first seen later (``val/score/mean`` at the first
validation, say) widens the header through an atomic rewrite that keeps every row.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("repro.trainer")

STEP = "step"
SCORE = "critic/score/mean"
THROUGHPUT = "perf/throughput"
RESERVED = "perf/max_memory_reserved_gb"
ALLOCATED = "perf/max_memory_allocated_gb"
NVML_USED = "perf/nvml_memory_used_gb"
VAL_SCORE = "val/score/mean"
TAIL = 5
# Keys reduced across ranks by max (peaks); every other per-rank metric is averaged.
_MAX_KEYS_PREFIX = ("perf/max_memory", NVML_USED)
# Losses drawn in the fourth panel of curves.png when present.
LOSS_KEYS = ("actor/pg_loss", "critic/vf_loss", "actor/kl_loss", "actor/entropy")


@contextlib.contextmanager
def timer(name: str, timings: dict[str, float]) -> Iterator[None]:
    """Add the wall time of the block to ``timings["timing_s/<name>"]``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        key = f"timing_s/{name}"
        timings[key] = timings.get(key, 0.0) + time.perf_counter() - start


def reduce_rank_metrics(per_rank: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """One value per key from the ranks' dicts: peaks by max, everything else by mean."""
    per_rank = list(per_rank)
    keys = sorted({k for d in per_rank for k in d})
    out: dict[str, float] = {}
    for key in keys:
        values = [float(d[key]) for d in per_rank if key in d]
        out[key] = max(values) if key.startswith(_MAX_KEYS_PREFIX) else sum(values) / len(values)
    return out


def throughput_metrics(attention_mask: torch.Tensor, step_seconds: float, n_gpus: int) -> dict[str, float]:
    """verl's ``compute_throughout_metrics``: every token of the step (prompts and responses) per
    second of the step and per GPU (rank)."""
    tokens = int(attention_mask.sum().item())
    return {"perf/total_num_tokens": tokens, "perf/time_per_step": step_seconds,
            "perf/throughput": tokens / (step_seconds * n_gpus)}


def masked_stats(prefix: str, values: torch.Tensor, mask: torch.Tensor | None = None,
                 empty: float = 0.0) -> dict[str, float]:
    """``<prefix>/mean|max|min`` of ``values`` (over ``mask`` where given; ``empty`` when none is)."""
    v = values[mask.bool()] if mask is not None else values.reshape(-1)
    if v.numel() == 0:
        return {f"{prefix}/mean": empty, f"{prefix}/max": empty, f"{prefix}/min": empty}
    v = v.double()
    return {f"{prefix}/mean": v.mean().item(), f"{prefix}/max": v.max().item(), f"{prefix}/min": v.min().item()}


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _parse(text: str) -> int | float | str | None:
    if text == "":
        return None
    # An integer was written as one (floats always carry a '.', an 'e' or 'inf'/'nan' through repr):
    # read it back as one, so a resume's rewrite leaves the rows it keeps byte for byte as they were.
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


class MetricsLog:
    """``metrics.tsv``: a header line, then one tab-separated row per step, flushed as written."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.columns: list[str] = []
        self.rows: list[dict[str, Any]] = []
        if self.path.is_file():
            self._read()

    def _read(self) -> None:
        lines = self.path.read_text().splitlines()
        if not lines:
            return
        self.columns = lines[0].split("\t")
        for line in lines[1:]:
            if not line.strip():
                continue
            cells = line.split("\t")
            if len(cells) != len(self.columns):
                # A row cut short by a kill in the middle of a write: it was never complete.
                log.warning("metrics.tsv: dropping a partial row (%d of %d cells)", len(cells), len(self.columns))
                continue
            row = {c: _parse(v) for c, v in zip(self.columns, cells, strict=True)}
            row[STEP] = int(row[STEP])
            self.rows.append(row)

    def truncate_after(self, step: int) -> int:
        """Drop the rows after ``step`` (a resume recomputes them); returns how many went."""
        kept = [r for r in self.rows if r[STEP] <= step]
        dropped = len(self.rows) - len(kept)
        if dropped:
            self.rows = kept
            self._rewrite()
        return dropped

    def append(self, row: Mapping[str, Any]) -> None:
        row = dict(row)
        if STEP not in row:
            raise ValueError("a metrics row needs a 'step' key")
        if not self.columns:
            self.columns = [STEP] + sorted(k for k in row if k != STEP)
            self.rows.append(row)
            self._rewrite()
            return
        new = sorted(k for k in row if k not in self.columns)
        self.rows.append(row)
        if new:
            self.columns.extend(new)
            self._rewrite()
            return
        with open(self.path, "a") as f:
            f.write("\t".join(_fmt(row.get(c)) for c in self.columns) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _rewrite(self) -> None:
        text = "\t".join(self.columns) + "\n"
        text += "".join("\t".join(_fmt(r.get(c)) for c in self.columns) + "\n" for r in self.rows)
        _atomic_write(self.path, text)


# Read once, at import: os.umask can only be read by setting it, and setting it while other threads
# create files (Ray's, the rank processes') would briefly change their files' modes too.
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    # mkstemp makes the file 0600; give it the mode a plain open() would, as the run's other files have.
    os.fchmod(fd, 0o666 & ~_UMASK)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _finite(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def summarize(rows: list[Mapping[str, Any]], wall_s: float | None = None,
              val_before_train: float | None = None) -> dict[str, Any]:
    """The run's headline figures from its metric rows."""
    scores = [r.get(SCORE) for r in rows]
    finite_scores = _finite(scores)
    tail = rows[-TAIL:]

    def tail_mean(key: str) -> float | None:
        vals = _finite(r.get(key) for r in tail)
        return sum(vals) / len(vals) if vals else None

    def peak(key: str) -> float | None:
        vals = _finite(r.get(key) for r in rows)
        return max(vals) if vals else None

    vals = [r for r in rows if isinstance(r.get(VAL_SCORE), float)]
    out: dict[str, Any] = {
        "steps": len(rows),
        "last_step": rows[-1][STEP] if rows else 0,
        "first_score": scores[0] if rows else None,
        "max_score": max(finite_scores) if finite_scores else None,
        "last_score": scores[-1] if rows else None,
        "avg_score_tail5": tail_mean(SCORE),
        "avg_throughput_tail5": tail_mean(THROUGHPUT),
        "avg_step_s_tail5": tail_mean("timing_s/step"),
        "max_memory_reserved_gb": peak(RESERVED),
        "max_memory_allocated_gb": peak(ALLOCATED),
        "max_nvml_memory_used_gb": peak(NVML_USED),
        "first_val_score": vals[0][VAL_SCORE] if vals else None,
        "last_val_score": vals[-1][VAL_SCORE] if vals else None,
        "nonfinite_loss_steps": sum(
            1 for r in rows for k in LOSS_KEYS if isinstance(r.get(k), float) and not math.isfinite(r[k])
        ),
    }
    if val_before_train is not None:
        out["val_before_train"] = val_before_train
    if wall_s is not None:
        out["wall_s"] = round(wall_s, 2)
    return out


def write_summary(path: str | os.PathLike[str], summary: Mapping[str, Any]) -> None:
    """``summary.tsv``: ``key<TAB>value`` lines."""
    text = "key\tvalue\n" + "".join(f"{k}\t{_fmt(v)}\n" for k, v in summary.items())
    _atomic_write(Path(path), text)


def read_summary(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read ``summary.tsv`` back (numbers as floats)."""
    lines = Path(path).read_text().splitlines()[1:]
    return {k: _parse(v) for k, v in (line.split("\t", 1) for line in lines if line)}


def plot_curves(rows: list[Mapping[str, Any]], path: str | os.PathLike[str], title: str = "",
                val_before_train: float | None = None) -> None:
    """``curves.png``: score, throughput, memory and losses against step (validation at step 0 if given)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r[STEP] for r in rows]

    def series(key: str) -> tuple[list[int], list[float]]:
        pts = [(s, r[key]) for s, r in zip(steps, rows, strict=True) if isinstance(r.get(key), float)]
        if key == VAL_SCORE and val_before_train is not None:
            pts.insert(0, (0, val_before_train))
        return [p[0] for p in pts], [p[1] for p in pts]

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    panels = [
        (axes[0][0], "score", "mean score (train: sampled; val: greedy)", [(SCORE, "train score"), (VAL_SCORE, "val score")]),
        (axes[0][1], "tokens/s per rank", "throughput", [(THROUGHPUT, "perf/throughput")]),
        (axes[1][0], "GB", "peak memory per rank (torch allocator and NVML on GPU; process RSS on CPU)",
         [(RESERVED, "max reserved"), (ALLOCATED, "max allocated"), (NVML_USED, "NVML used")]),
        (axes[1][1], "value", "losses and entropy", [(k, k) for k in LOSS_KEYS]),
    ]
    for ax, ylabel, panel_title, keys in panels:
        ax.set_title(panel_title, fontsize=9)
        drawn = False
        for key, label in keys:
            xs, ys = series(key)
            if xs:
                ax.plot(xs, ys, marker="o" if key == VAL_SCORE or len(xs) < 30 else None, ms=3, label=label)
                drawn = True
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, path)


class StepReporter:
    """A tqdm bar (step, score, throughput) on a terminal, one log line per step otherwise."""

    def __init__(self, total: int, start: int, mode: str = "auto") -> None:
        use_bar = mode == "bar" or (mode == "auto" and sys.stderr.isatty())
        self.bar = None
        if use_bar:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, desc="RL steps", unit="step", dynamic_ncols=True)

    def update(self, step: int, total: int, row: Mapping[str, Any]) -> None:
        score, tput, step_s = row.get(SCORE), row.get(THROUGHPUT), row.get("timing_s/step")
        if self.bar is not None:
            post = {"score": f"{score:.3f}", "tok/s": f"{tput:.0f}"}
            if isinstance(row.get(VAL_SCORE), float):
                post["val"] = f"{row[VAL_SCORE]:.3f}"
            self.bar.set_postfix(post, refresh=False)
            self.bar.update(1)
            # Also into train.log (the bar itself only goes to the terminal).
            log.debug("step %d/%d score %.4f throughput %.1f step_s %.2f", step, total, score, tput, step_s)
            return
        extra = f" val {row[VAL_SCORE]:.4f}" if isinstance(row.get(VAL_SCORE), float) else ""
        log.info("step %d/%d score %.4f throughput %.1f tok/s step %.2f s%s", step, total, score, tput, step_s, extra)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
