"""repro's rule rewards in the form verl's ``reward.custom_reward_function`` calls.

verl scores a response with ``compute_score(data_source, solution_str, ground_truth, extra_info)``;
repro's rewards are looked up by the row's ``data_source`` (``repro.rewards``), with the tiny
task's settings (strict ``#### N``, 0.1 for a formatted wrong answer: the ``grpo_tiny`` preset's).
"""

from __future__ import annotations

from typing import Any

from repro.rewards import get_reward_fn

REWARD_KWARGS = {"method": "strict", "format_score": 0.1, "score": 1.0}


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None,
                  **_: Any) -> float:
    return float(get_reward_fn(data_source)(solution_str, ground_truth, **REWARD_KWARGS))
