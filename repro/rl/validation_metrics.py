"""verl's validation metric layout: ``val-core/<data_source>/<var>/<metric>`` and ``val-aux/...``.

As verl 0.9.1's trainer reports a validation pass (``metric_utils.process_validation_metrics`` and
``RayPPOTrainer._val_metrics_update``; checked against both in ``tests/verl_parity``):

- samples are grouped by data source and prompt (``uid``); per prompt and variable (``reward``,
  the score; any other numeric per-sample variable passed in): ``mean@N`` over its N samples and,
  when N > 1, ``std@N`` (population std) and for k = 2, 4, 8, ... < N and k = N the bootstrap
  statistics ``best@k/mean|std`` and ``worst@k/mean|std`` (1000 draws of k samples with
  replacement, numpy's legacy generator seeded 42, re-seeded for every prompt and k, as verl);
- each metric is then averaged over the prompts of a data source;
- ``val-core`` holds the core variable's (``acc`` when present, else ``reward``) ``mean``, ``maj``
  and ``best`` metrics at the largest N; everything else is ``val-aux``.

repro's rewards give no ``pred`` (majority-vote) field, so there are no ``maj@k`` metrics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

BOOTSTRAP_DRAWS = 1000
BOOTSTRAP_SEED = 42


def subset_sizes(n: int) -> list[int]:
    """The bootstrap subset sizes of a prompt with ``n`` samples: powers of 2 below ``n``, then ``n``."""
    if n <= 1:
        return []
    sizes, k = [], 2
    while k < n:
        sizes.append(k)
        k *= 2
    return sizes + [n]


def best_worst(values: np.ndarray, k: int, draws: int = BOOTSTRAP_DRAWS,
               seed: int = BOOTSTRAP_SEED) -> tuple[float, float, float, float]:
    """``(best mean, best std, worst mean, worst std)`` of the max / min of ``draws`` resamples of size ``k``."""
    picks = values[np.random.RandomState(seed).choice(len(values), size=(draws, k), replace=True)]
    best, worst = picks.max(axis=1), picks.min(axis=1)
    return float(best.mean()), float(best.std()), float(worst.mean()), float(worst.std())


def prompt_metrics(values: Sequence[float]) -> dict[str, float]:
    """One prompt's metrics of one variable over its samples."""
    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    out = {f"mean@{n}": float(v.mean())}
    if n > 1:
        out[f"std@{n}"] = float(v.std())
        for k in subset_sizes(n):
            bm, bs, wm, ws = best_worst(v, k)
            out.update({f"best@{k}/mean": bm, f"best@{k}/std": bs, f"worst@{k}/mean": wm, f"worst@{k}/std": ws})
    return out


def _n_of(metric: str) -> int:
    return int(metric.split("@")[-1].split("/")[0])


def validation_metrics(data_sources: Sequence[str], uids: Sequence[Any],
                       variables: Mapping[str, Sequence[float | None]]) -> dict[str, float]:
    """verl's ``val-core`` / ``val-aux`` metrics of one validation pass (one entry per sample in each list)."""
    grouped: dict[str, dict[Any, dict[str, list[float]]]] = {}
    for i, (source, uid) in enumerate(zip(data_sources, uids, strict=True)):
        per_var = grouped.setdefault(source, {}).setdefault(uid, {})
        for name, values in variables.items():
            if values[i] is not None:
                per_var.setdefault(name, []).append(values[i])
    out: dict[str, float] = {}
    for source, prompts in grouped.items():
        per_metric: dict[str, dict[str, list[float]]] = {}
        for per_var in prompts.values():
            for name, values in per_var.items():
                for metric, value in prompt_metrics(values).items():
                    per_metric.setdefault(name, {}).setdefault(metric, []).append(value)
        core = "acc" if "acc" in per_metric else "reward"
        for name, metrics in per_metric.items():
            n_max = max(_n_of(m) for m in metrics)
            for metric, values in metrics.items():
                is_core = name == core and metric.startswith(("mean", "maj", "best")) and _n_of(metric) == n_max
                out[f"{'val-core' if is_core else 'val-aux'}/{source}/{name}/{metric}"] = float(np.mean(values))
    return out
