"""repro's rule rewards in the form verl's ``reward.custom_reward_function`` calls.

verl scores a response with ``compute_score(data_source, solution_str, ground_truth, extra_info)``;
repro's rewards are looked up by the row's ``data_source`` (``repro.rewards``), with the tiny
task's settings (strict ``#### N``, 0.1 for a formatted wrong answer: the ``grpo_tiny`` preset's).
verl's ``reward.custom_reward_function.reward_kwargs`` (``method``, ``format_score``, ``score``) replace
them: they are what repro's own trainer reads from ``reward.reward_kwargs``, a key verl's default reward
manager never reads (docs/verl_engine.md, "The seed PR's command lines").
"""

from __future__ import annotations

from typing import Any

from repro.rewards import get_reward_fn

REWARD_KWARGS = {"method": "strict", "format_score": 0.1, "score": 1.0}


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, *,
                  method: str = REWARD_KWARGS["method"], format_score: float = REWARD_KWARGS["format_score"],
                  score: float = REWARD_KWARGS["score"], **_: Any) -> float:
    # **_: verl adds keywords of its own (a reward model's router address) that a rule reward ignores.
    return float(get_reward_fn(data_source)(solution_str, ground_truth, method=method, format_score=format_score,
                                            score=score))
