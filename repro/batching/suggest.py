"""A whole valid batch combination, for when no single key can fix a plan.

On 3 GPUs the tiny preset (train batch 32, mini-batch 16, micro 64, 8 samples per prompt) needs
two keys changed at once: the nearest train batch sizes that split (30, 33) leave the mini-batch
(16) unsplittable, and so on round the circle. :func:`nearest_combination` searches train batch,
mini-batch and micro-batch together and returns the valid combination that changes the fewest
keys, then the one closest to what was asked (sum of log ratios, so halving and doubling weigh
the same). It takes the validity test as an argument, so it needs nothing from ``plan``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

_FIELDS = ("train_batch_size", "ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu")


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def nearest_combination(p: Any, is_valid: Callable[[Any], bool], dp: int) -> dict[str, int] | None:
    """The changed fields (``BatchParams`` field -> value) of the nearest valid combination, or None.

    Train batch sizes from 1/4 to 4x the asked one are tried, each mini-batch a divisor of it,
    and the micro-batch stays as asked when it divides the rank's mini-batch, else the nearest divisor.
    """
    asked = {name: getattr(p, name) for name in _FIELDS}
    dynamic = p.use_dynamic_bsz or p.ppo_micro_batch_size is not None
    best: tuple[tuple[int, float], dict[str, int]] | None = None
    # Only multiples of `step` split tbs * rollout.n samples evenly across dp ranks.
    step = dp // math.gcd(p.rollout_n, dp)
    first = -(-max(1, p.train_batch_size // 4) // step) * step
    for tbs in range(first, 4 * p.train_batch_size + 1, step):
        for mini in _divisors(tbs):
            if (mini * p.rollout_n) % dp:
                continue
            values = {"train_batch_size": tbs, "ppo_mini_batch_size": mini}
            if best is not None and _cost(values, asked) >= best[0]:
                continue  # a micro-batch change could only add to it
            if not dynamic:
                per_rank = mini * p.rollout_n // dp
                micro = asked["ppo_micro_batch_size_per_gpu"] or 1
                if per_rank % micro:
                    micro = min(_divisors(per_rank), key=lambda d: (abs(math.log(d / micro)), -d))
                values["ppo_micro_batch_size_per_gpu"] = micro
            cost = _cost(values, asked)
            if cost[0] == 0 or (best is not None and cost >= best[0]):
                continue
            if is_valid(replace(p, **values)):
                best = (cost, {k: v for k, v in values.items() if v != asked[k]})
    return None if best is None else best[1]


def _cost(values: dict[str, int], asked: dict[str, Any]) -> tuple[int, float]:
    """(keys changed, sum of |log(new / asked)|): fewer keys first, then the closer values."""
    changed = [(v, asked[k]) for k, v in values.items() if v != asked[k]]
    return len(changed), sum(abs(math.log(v / a)) if a else 1.0 for v, a in changed)

