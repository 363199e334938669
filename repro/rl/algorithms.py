"""RL math of PPO and GRPO: advantages, losses, KL estimators, entropy and masked reductions.

Pure tensor functions, shared by the workers (losses) and the driver (advantages). All token
tensors are ``[B, R]`` over the response positions with ``response_mask`` 1 on real tokens.

Loss aggregation (:func:`agg_loss`) takes optional denominators so that a mini-batch split into
micro-batches (and across data-parallel ranks) sums to exactly the loss of the whole mini-batch:
each micro-batch divides its token (or sequence) sum by the count of the *whole* mini-batch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from repro.config import KL_LOSS_TYPES, LOSS_AGG_MODES


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is 1.

    Entries outside the mask are selected away, not multiplied by 0: a NaN or inf there (a padded
    position's log-prob, say) would otherwise poison the sum, as ``nan * 0`` is NaN (verl does the same).
    """
    prod = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device)) * mask
    return prod.sum() if dim is None else prod.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1 (0 where the mask is empty)."""
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries (Bessel-corrected when ``unbiased``)."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        if count <= 1:
            raise ValueError(f"masked_var needs at least 2 unmasked entries for an unbiased variance, got {int(count)}")
        var = var * count / (count - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise the masked entries to unit variance (and zero mean when ``shift_mean``)."""
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + 1e-8)
    return whitened if shift_mean else whitened + mean


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    token_denominator: float | torch.Tensor | None = None,
    seq_denominator: float | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Reduce a ``[B, R]`` token loss to a scalar.

    - ``token-mean``: sum over all unmasked tokens / number of those tokens.
    - ``seq-mean-token-sum``: mean over sequences of each sequence's token sum.
    - ``seq-mean-token-mean``: mean over sequences of each sequence's token mean.
    - ``token-sum``: sum over all unmasked tokens (no denominator).
    - ``seq-mean-token-sum-norm``: ``seq-mean-token-sum`` over ``loss_scale_factor`` (verl's
      ``actor.loss_scale_factor``, Dr. GRPO's constant normaliser), the padded response width
      when None (verl's default).

    The seq-mean modes count only sequences with at least one unmasked token (verl: an empty,
    aborted response does not dilute the mean). An all-masked batch gives 0 where verl's local
    count gives 0/0 = NaN: a rank's micro-batch may legitimately hold no response token.

    ``token_denominator`` / ``seq_denominator`` replace the local counts (the mini-batch's
    global counts, when this batch is one micro-batch of it).
    """
    if loss_agg_mode == "token-mean":
        denom = loss_mask.sum().clamp(min=1) if token_denominator is None else token_denominator
        return masked_sum(loss_mat, loss_mask) / denom
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask)
    if loss_agg_mode == "seq-mean-token-sum-norm":
        norm = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
        return agg_loss(loss_mat, loss_mask, "seq-mean-token-sum", seq_denominator=seq_denominator) / norm
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        seq_losses = masked_sum(loss_mat, loss_mask, dim=-1)
        if loss_agg_mode == "seq-mean-token-mean":
            seq_losses = seq_losses / loss_mask.sum(dim=-1).clamp(min=1)
        if seq_denominator is None:
            denom = (loss_mask.sum(dim=-1) > 0).sum().clamp(min=1)
        else:
            denom = seq_denominator
        return seq_losses.sum() / denom
    raise ValueError(f"loss_agg_mode={loss_agg_mode!r} is not valid; choose one of {list(LOSS_AGG_MODES)}")


def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: list | torch.Tensor,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: each response's total reward minus its prompt group's mean (over the group's std).

    ``index[i]`` names the prompt of sample ``i``. A group of one sample is scored against mean 0
    and std 1, as in verl, so with ``rollout.n=1`` the advantage is the raw score and the policy
    still learns. Returns ``(advantages, returns)``, equal, ``[B, R]``.
    """
    scores = token_level_rewards.sum(dim=-1)
    keys = index.tolist() if isinstance(index, torch.Tensor) else list(index)
    if len(keys) != scores.shape[0]:
        raise ValueError(f"index has {len(keys)} entries for {scores.shape[0]} samples")
    groups: dict = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    mean = torch.zeros_like(scores)
    std = torch.ones_like(scores)
    for members in groups.values():
        if len(members) > 1:
            idx = torch.tensor(members)
            group_scores = scores[idx]
            mean[idx] = group_scores.mean()
            std[idx] = group_scores.std()
    centred = scores - mean
    if norm_adv_by_std_in_grpo:
        centred = centred / (std + epsilon)
    advantages = centred.unsqueeze(-1) * response_mask
    return advantages, advantages


def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the response; masked positions are stepped over.

    Returns ``(advantages, returns)``: returns = raw advantages + values; advantages whitened
    over the unmasked tokens.
    """
    with torch.no_grad():
        batch, length = token_level_rewards.shape
        next_value = torch.zeros(batch, dtype=values.dtype, device=values.device)
        running = torch.zeros_like(next_value)
        out = torch.zeros_like(values)
        mask = response_mask.to(values.dtype)
        for t in range(length - 1, -1, -1):
            delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
            candidate = delta + gamma * lam * running
            m = mask[:, t]
            # A padded position neither bootstraps nor resets the running sums.
            running = m * candidate + (1 - m) * running
            next_value = m * values[:, t] + (1 - m) * next_value
            out[:, t] = running
        returns = out + values
        advantages = masked_whiten(out, mask) * mask
    return advantages, returns


class PolicyLoss(NamedTuple):
    """PPO policy loss and its statistics."""

    loss: torch.Tensor
    """Aggregated scalar loss."""
    token_losses: torch.Tensor
    """``[B, R]`` per-token clipped losses (before aggregation)."""
    clipfrac: torch.Tensor
    """Fraction of tokens where the ratio clip was active."""
    ppo_kl: torch.Tensor
    """Mean of ``old_log_prob - log_prob`` (approximate KL to the rollout policy)."""
    clipfrac_lower: torch.Tensor
    """Fraction of tokens where the dual clip (negative advantages) was active."""


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    *,
    token_denominator: float | torch.Tensor | None = None,
    seq_denominator: float | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> PolicyLoss:
    """PPO clipped surrogate with the dual clip for negative advantages (arXiv:1912.09729)."""
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c={clip_ratio_c} must be > 1 (dual clip)")
    # Clamp before exp so a stale log-prob cannot overflow the ratio.
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    ppo_losses = torch.maximum(unclipped, clipped)
    clipfrac = masked_mean(torch.gt(clipped, unclipped).float(), response_mask)
    dual_bound = -advantages * clip_ratio_c
    dual_losses = torch.minimum(dual_bound, ppo_losses)
    negative = advantages < 0
    clipfrac_lower = masked_mean((torch.gt(ppo_losses, dual_bound) & negative).float(), response_mask)
    token_losses = torch.where(negative, dual_losses, ppo_losses)
    loss = agg_loss(token_losses, response_mask, loss_agg_mode,
                    token_denominator=token_denominator, seq_denominator=seq_denominator,
                    loss_scale_factor=loss_scale_factor)
    return PolicyLoss(loss, token_losses, clipfrac, ppo_kl, clipfrac_lower)


class ValueLoss(NamedTuple):
    """Clipped value loss and its clip fraction."""

    loss: torch.Tensor
    clipfrac: torch.Tensor


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    *,
    token_denominator: float | torch.Tensor | None = None,
    seq_denominator: float | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> ValueLoss:
    """0.5 * max((v - R)^2, (clip(v, v_old +- c) - R)^2), aggregated."""
    # Clamp the prediction itself: ``values + clamp(vpreds - values)`` rounds an unclipped
    # prediction off by an ulp, and the clip fraction would count that as clipping.
    clipped_preds = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    losses = (vpreds - returns) ** 2
    clipped_losses = (clipped_preds - returns) ** 2
    token_losses = torch.maximum(losses, clipped_losses)
    loss = 0.5 * agg_loss(token_losses, response_mask, loss_agg_mode,
                          token_denominator=token_denominator, seq_denominator=seq_denominator,
                          loss_scale_factor=loss_scale_factor)
    clipfrac = masked_mean(torch.gt(clipped_losses, losses).float(), response_mask)
    return ValueLoss(loss, clipfrac)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference (Schulman's k1/k2/k3).

    A ``+`` suffix keeps the estimate's value but takes k2's gradient (straight-through): k1 and
    k3 estimate the KL without bias, but their gradients do not estimate its gradient; k2's does.
    """
    if kind.endswith("+") and kind in KL_LOSS_TYPES:
        value = kl_penalty(logprob, ref_logprob, kind[:-1])
        k2 = 0.5 * (logprob - ref_logprob).square()
        return k2 - k2.detach() + value.detach()
    diff = logprob - ref_logprob
    if kind in ("kl", "k1"):
        return diff
    if kind == "abs":
        return diff.abs()
    if kind in ("mse", "k2"):
        return 0.5 * diff.square()
    if kind in ("low_var_kl", "k3"):
        log_ratio = torch.clamp(-diff, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"KL kind {kind!r} is not valid; choose one of {list(KL_LOSS_TYPES)}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the softmax distribution along the last dimension."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability of ``labels`` under ``softmax(logits)``."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
