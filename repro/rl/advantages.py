"""Outcome advantage estimators beyond GRPO and GAE, selected by verl's ``algorithm.adv_estimator``.

Each takes the ``[B, R]`` token rewards, the response mask and the prompt id of every sample
(``index``; ``rollout.n`` samples share one) and returns ``(advantages, returns)``, ``[B, R]``,
with verl 0.9.1's semantics (checked against it in ``tests/verl_parity``):

- ``rloo``: leave-one-out baseline, ``n/(n-1) * (r - mean)``; a group of one keeps its score.
- ``reinforce_plus_plus``: discounted return per token, whitened over the batch's response tokens.
- ``reinforce_plus_plus_baseline``: score minus the group mean, whitened over the response tokens.
- ``opo``: score minus the length-weighted group mean (optimal baseline for outcome rewards).
- ``gpg``: score minus the group mean, scaled by ``B / (number of non-zero scores)``.
- ``grpo_passk``: only each group's best response gets ``r_max - r_second``, over the group std
  when ``norm_adv_by_std_in_grpo``; needs at least 2 samples per group.
- ``remax``: the return-to-go of each token minus the score of the prompt's greedy response
  (``reward_baselines``, one per sample; the trainer generates it with ``do_sample=False``).

``compute_advantage`` dispatches every estimator, ``gae`` and ``grpo`` included.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from repro.config import ADV_ESTIMATORS
from repro.rl.algorithms import compute_gae_advantage_return, compute_grpo_outcome_advantage, masked_whiten


def _groups(index: Sequence | torch.Tensor, size: int) -> list[list[int]]:
    keys = index.tolist() if isinstance(index, torch.Tensor) else list(index)
    if len(keys) != size:
        raise ValueError(f"index has {len(keys)} entries for {size} samples")
    groups: dict = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _outcome(scores: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    adv = scores.unsqueeze(-1) * mask
    return adv, adv


def compute_rloo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                   index: Sequence | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (arXiv:2402.14740): each score against the mean of the other samples of its prompt."""
    scores = token_level_rewards.sum(dim=-1)
    out = scores.clone()
    for members in _groups(index, scores.shape[0]):
        n = len(members)
        if n > 1:
            idx = torch.tensor(members)
            out[idx] = (scores[idx] - scores[idx].mean()) * n / (n - 1)
    return _outcome(out, response_mask)


def compute_reinforce_plus_plus_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                                  gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (arXiv:2501.03262): discounted returns, whitened over all response tokens."""
    mask = response_mask.to(token_level_rewards.dtype)
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in range(token_level_rewards.shape[1] - 1, -1, -1):
        candidate = token_level_rewards[:, t] + gamma * running
        returns[:, t] = candidate * mask[:, t]
        # A padded position carries the running return past itself unchanged.
        running = candidate * mask[:, t] + running * (1 - mask[:, t])
    return masked_whiten(returns, mask) * mask, returns


def compute_reinforce_plus_plus_baseline_outcome_advantage(
        token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
        index: Sequence | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with the group mean as baseline, whitened over all response tokens."""
    scores = token_level_rewards.sum(dim=-1)
    centred = scores.clone()
    for members in _groups(index, scores.shape[0]):
        if len(members) > 1:
            idx = torch.tensor(members)
            centred[idx] = scores[idx] - scores[idx].mean()
    mask = response_mask.to(scores.dtype)
    adv = masked_whiten(centred.unsqueeze(-1) * mask, mask) * mask
    return adv, adv


def compute_opo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                  index: Sequence | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (arXiv:2505.23585): score minus the response-length-weighted mean score of the group."""
    scores = token_level_rewards.sum(dim=-1)
    lengths = response_mask.sum(dim=-1).to(scores.dtype)
    out = scores.clone()
    for members in _groups(index, scores.shape[0]):
        if len(members) > 1:
            idx = torch.tensor(members)
            out[idx] = scores[idx] - (lengths[idx] * scores[idx]).sum() / lengths[idx].sum()
    return _outcome(out, response_mask)


def compute_gpg_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                  index: Sequence | torch.Tensor, f_norm: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (arXiv:2504.02546): group-centred score times ``B / #non-zero scores`` (over ``f_norm``)."""
    scores = token_level_rewards.sum(dim=-1)
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1)
    mean = torch.zeros_like(scores)
    for members in _groups(index, scores.shape[0]):
        if len(members) > 1:
            idx = torch.tensor(members)
            mean[idx] = scores[idx].mean()
    return _outcome(alpha * (scores - mean) / f_norm, response_mask)


def compute_grpo_passk_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                         index: Sequence | torch.Tensor, norm_adv_by_std_in_grpo: bool = True,
                                         epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k GRPO (arXiv:2503.19595): the group's best response gets ``r_max - r_second``, others 0."""
    scores = token_level_rewards.sum(dim=-1)
    out = torch.zeros_like(scores)
    for members in _groups(index, scores.shape[0]):
        if len(members) < 2:
            raise ValueError(f"algorithm.adv_estimator=grpo_passk needs >= 2 samples per prompt "
                             f"(actor_rollout_ref.rollout.n >= 2), got a group of {len(members)}")
        group = scores[torch.tensor(members)]
        top, where = torch.topk(group, 2)
        gap = top[0] - top[1]
        if norm_adv_by_std_in_grpo:
            gap = gap / (group.std() + epsilon)
        out[members[int(where[0])]] = gap
    return _outcome(out, response_mask)


def compute_remax_outcome_advantage(token_level_rewards: torch.Tensor, reward_baselines: torch.Tensor,
                                    response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (arXiv:2310.10505): undiscounted return-to-go minus the greedy response's score.

    Returns are not whitened: the greedy baseline already centres them, which is ReMax's point.
    """
    mask = response_mask.to(token_level_rewards.dtype)
    masked = torch.where(response_mask.bool(), token_level_rewards, 0.0)
    returns = masked.flip(-1).cumsum(-1).flip(-1)
    return returns - reward_baselines.to(returns.dtype).unsqueeze(-1) * mask, returns


def compute_advantage(name: str, token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                      index: Sequence | torch.Tensor, *, values: torch.Tensor | None = None, gamma: float = 1.0,
                      lam: float = 1.0, norm_adv_by_std_in_grpo: bool = True,
                      reward_baselines: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(advantages, returns)`` of estimator ``name`` (verl's ``algorithm.adv_estimator``).

    ``reward_baselines`` (``[B]``) is ``remax``'s greedy-response score of each sample's prompt.
    """
    r, m = token_level_rewards, response_mask
    if name == "remax":
        if reward_baselines is None:
            raise ValueError("algorithm.adv_estimator=remax needs reward_baselines (the greedy responses' scores)")
        return compute_remax_outcome_advantage(r, reward_baselines, m)
    if name == "gae":
        if values is None:
            raise ValueError("algorithm.adv_estimator=gae needs the critic's values")
        return compute_gae_advantage_return(r, values, m, gamma, lam)
    if name == "grpo":
        return compute_grpo_outcome_advantage(r, m, index, norm_adv_by_std_in_grpo)
    if name == "grpo_passk":
        return compute_grpo_passk_outcome_advantage(r, m, index, norm_adv_by_std_in_grpo)
    if name == "reinforce_plus_plus":
        return compute_reinforce_plus_plus_outcome_advantage(r, m, gamma)
    grouped = {"rloo": compute_rloo_outcome_advantage, "opo": compute_opo_outcome_advantage,
               "gpg": compute_gpg_outcome_advantage,
               "reinforce_plus_plus_baseline": compute_reinforce_plus_plus_baseline_outcome_advantage}
    if name not in grouped:
        raise ValueError(f"algorithm.adv_estimator={name!r} is not valid; choose one of {list(ADV_ESTIMATORS)}")
    return grouped[name](r, m, index)
