"""What one rollout call samples: the rollout config's knobs with the call's overrides applied.

Both rollouts resolve their arguments here, so ``rollout.temperature=0`` or ``do_sample=False``
means greedy for HF ``generate`` and vLLM alike, and ``response_length`` falls back to
``data.max_response_length`` in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from repro.config import RunConfig


@dataclass(frozen=True)
class Sampling:
    """Resolved sampling of one call; ``greedy`` when sampling is off or the temperature is 0."""

    greedy: bool
    temperature: float
    top_p: float
    top_k: int
    """-1 or 0 disables top-k."""
    response_length: int


def resolve(cfg: RunConfig, *, temperature: float | None = None, top_p: float | None = None,
            top_k: int | None = None, do_sample: bool | None = None,
            response_length: int | None = None) -> Sampling:
    """The call's overrides over ``actor_rollout_ref.rollout`` (validation passes its val_kwargs)."""
    ro = cfg.actor_rollout_ref.rollout
    temperature = ro.temperature if temperature is None else temperature
    do_sample = ro.do_sample if do_sample is None else do_sample
    length = response_length or ro.response_length or cfg.data.max_response_length
    if length <= 0:
        raise ValueError(f"actor_rollout_ref.rollout.response_length={length}: must be > 0")
    return Sampling(
        greedy=not (do_sample and temperature > 0),
        temperature=temperature,
        top_p=ro.top_p if top_p is None else top_p,
        top_k=ro.top_k if top_k is None else top_k,
        response_length=length,
    )
