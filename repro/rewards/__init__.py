"""Rule rewards, looked up by a parquet row's ``data_source``.

``get_reward_fn(data_source)`` returns a callable with verl's GSM8K signature
``fn(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0) -> float``;
the trainer passes ``reward.reward_kwargs`` (``method``, ``format_score``, ``score``) through.
``reward_lookup(custom_reward(cfg))`` is what the trainer uses: the same lookup, or verl's reward plug-in
(``custom_reward_function``, :mod:`repro.rewards.custom`) for every data source when one is set; the
plug-in also gets the row's ``extra_info`` (``score_responses(..., extra_infos=...)``), the rules do not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def reward_lookup(found: tuple[str, Any] | None) -> Callable[[str], RewardFn]:
    """``data_source -> reward fn``: the plug-in ``found`` ((config key, its section), from
    ``repro.config.custom_reward(cfg)``) if one is set, else the rule rewards."""
    from repro.rewards.custom import as_float, load_custom_reward, verl_extra_info

    if found is None:
        return get_reward_fn
    key, section = found
    fn = load_custom_reward(key, section.path, section.name, section.reward_kwargs)

    def lookup(data_source: str) -> RewardFn:
        # reward.reward_kwargs are the GSM8K rule's; the plug-in has its own (bound at load).
        def score(solution_str: str, ground_truth: str, extra_info: dict | None = None, **_: Any) -> float:
            return as_float(fn(data_source, solution_str, ground_truth, verl_extra_info(extra_info)))

        return score

    return lookup


__all__ = ["RewardFn", "get_reward_fn", "known_sources", "reward_lookup"]
