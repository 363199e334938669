"""Rule rewards, looked up by a parquet row's ``data_source``.

``get_reward_fn(data_source)`` returns a callable with verl's GSM8K signature
``fn(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0) -> float``;
the trainer passes ``reward.reward_kwargs`` (``method``, ``format_score``, ``score``) through.
"""

from __future__ import annotations

from collections.abc import Callable

from repro.rewards import gsm8k

RewardFn = Callable[..., float]

# The synthetic task writes answers as "#### N", so GSM8K's rule scores it unchanged.
_REGISTRY: dict[str, RewardFn] = {
    "openai/gsm8k": gsm8k.compute_score,
    "repro/arith": gsm8k.compute_score,
}


def known_sources() -> list[str]:
    """Data sources that have a reward function."""
    return sorted(_REGISTRY)


def get_reward_fn(data_source: str) -> RewardFn:
    """The reward function for ``data_source``; ``ValueError`` listing the known ones otherwise."""
    try:
        return _REGISTRY[data_source]
    except KeyError:
        raise ValueError(
            f"no reward function for data_source={data_source!r}; known sources: {known_sources()}"
        ) from None


__all__ = ["RewardFn", "get_reward_fn", "known_sources"]
