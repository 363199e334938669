"""verl's policy losses beyond the PPO clip, selected by ``actor.policy_loss.loss_mode``.

Each returns :class:`repro.rl.algorithms.PolicyLoss` and aggregates with
:func:`repro.rl.algorithms.agg_loss` and the mini-batch's global denominators (and
``loss_scale_factor``), passed through as ``**denoms``, so a micro-batch split sums to the whole
mini-batch's loss as for ``vanilla``. Semantics are verl 0.9.1's (checked
against it in ``tests/verl_parity``); statistics verl does not report for a mode are 0.

- ``gspo`` (arXiv:2507.18071): one importance ratio per sequence (the mean token log-ratio), with
  each token's gradient; clipped like PPO without the dual clip.
- ``gpg`` (arXiv:2504.02546): plain policy gradient, ``-log_prob * advantage``.
- ``cispo`` (arXiv:2506.13585): ``-sg(clip(ratio)) * advantage * log_prob``.
- ``geo_mean`` (GMPO, arXiv:2507.20673): geometric mean of the clipped token ratios per sequence
  times the sequence's mean advantage, averaged over sequences (``loss_agg_mode`` unused, as in
  verl; the mean is over the mini-batch's sequences when given its count).
- ``clip_cov`` / ``kl_cov`` (arXiv:2505.22617): the PPO surrogate where a few high-covariance
  tokens (``clip_cov_ratio`` / ``kl_cov_ratio`` of them) are dropped from the gradient or get an
  ``|log-ratio|`` penalty (``ppo_kl_coef``). ``clip_cov`` picks among candidates with
  ``torch.randperm`` on the global generator, as verl does.
"""

from __future__ import annotations

import torch

from repro.config import POLICY_LOSS_MODES
from repro.rl.algorithms import PolicyLoss, agg_loss, compute_policy_loss, masked_mean

Denom = float | torch.Tensor | None


def _zero(ref: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=ref.dtype, device=ref.device)


def gspo(old: torch.Tensor, new: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, low: float, high: float,
         mode: str, **denoms: Denom) -> PolicyLoss:
    log_ratio = new - old
    lengths = mask.sum(dim=-1).clamp(min=1)
    seq_log_ratio = (torch.where(mask.bool(), log_ratio, 0.0) * mask).sum(dim=-1) / lengths
    # Value of the sequence ratio, gradient of each token's log-prob.
    log_seq_ratio = torch.clamp(new - new.detach() + seq_log_ratio.detach().unsqueeze(-1), max=10.0)
    ratio = torch.exp(log_seq_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1 - low, 1 + high)
    token_losses = torch.maximum(unclipped, clipped)
    loss = agg_loss(token_losses, mask, mode, **denoms)
    return PolicyLoss(loss, token_losses, masked_mean(torch.gt(clipped, unclipped).float(), mask),
                      masked_mean(-log_ratio, mask), _zero(loss))


def gpg(old: torch.Tensor, new: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, mode: str,
        **denoms: Denom) -> PolicyLoss:
    token_losses = -new * adv
    loss = agg_loss(token_losses, mask, mode, **denoms)
    return PolicyLoss(loss, token_losses, _zero(loss), masked_mean(old - new, mask).detach(), _zero(loss))


def cispo(old: torch.Tensor, new: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, low: float, high: float,
          mode: str, **denoms: Denom) -> PolicyLoss:
    log_ratio = torch.clamp(new - old, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - low, 1 + high)
    token_losses = -clipped.detach() * adv * new
    loss = agg_loss(token_losses, mask, mode, **denoms)
    return PolicyLoss(loss, token_losses, masked_mean((ratio != clipped).float(), mask),
                      masked_mean(-log_ratio, mask), _zero(loss))


def geo_mean(old: torch.Tensor, new: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, low: float, high: float,
             seq_denominator: Denom = None) -> PolicyLoss:
    log_ratio = new - old
    sign = torch.sign(adv)
    clamped = torch.clamp(log_ratio, -low, high)
    # The pessimistic side per sign of the advantage, as PPO's clip, in log space.
    bounded = sign * torch.min(sign * log_ratio, sign * clamped)
    lengths = mask.sum(dim=-1)
    keep = mask.bool()
    ratio = torch.exp((torch.where(keep, bounded, 0.0) * mask).sum(dim=-1) / (lengths + 1e-8))
    seq_adv = (torch.where(keep, adv, 0.0) * mask).sum(dim=-1) / (lengths + 1e-8)
    seq_losses = -seq_adv * ratio
    denom = seq_losses.shape[0] if seq_denominator is None else seq_denominator
    loss = seq_losses.sum() / denom
    was_clipped = torch.ne(log_ratio, clamped)
    return PolicyLoss(loss, seq_losses.unsqueeze(-1).expand_as(mask), masked_mean((was_clipped & (adv > 0)).float(), mask),
                      masked_mean(-log_ratio, mask), masked_mean((was_clipped & (adv < 0)).float(), mask))


def clip_cov(old: torch.Tensor, new: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, low: float, high: float,
             mode: str, ratio_share: float, lower: float, upper: float, **denoms: Denom) -> PolicyLoss:
    if ratio_share <= 0:
        raise ValueError(f"actor.policy_loss.clip_cov_ratio={ratio_share} must be > 0")
    log_ratio = new - old
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1 - low, 1 + high)
    valid = mask > 0
    cov = (adv - masked_mean(adv, mask)) * (new - masked_mean(new.detach(), mask))
    cov = cov.masked_fill(~valid | ((clipped > unclipped) & valid), -torch.inf)
    budget = max(int(ratio_share * mask.sum().item()), 1)
    candidates = torch.nonzero((cov < upper) & (cov > lower) & valid)
    keep = torch.ones_like(adv)
    if len(candidates):
        chosen = candidates[torch.randperm(len(candidates))[:min(budget, len(candidates))]]
        keep[chosen[:, 0], chosen[:, 1]] = 0
    token_losses = torch.maximum(unclipped, clipped) * keep
    loss = agg_loss(token_losses, mask, mode, **denoms)
    return PolicyLoss(loss, token_losses, masked_mean((keep == 0).float(), mask), masked_mean(-log_ratio, mask),
                      _zero(loss))


def kl_cov(old: torch.Tensor, new: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, mode: str,
           ratio_share: float, kl_coef: float, **denoms: Denom) -> PolicyLoss:
    if ratio_share <= 0:
        raise ValueError(f"actor.policy_loss.kl_cov_ratio={ratio_share} must be > 0")
    log_ratio = new - old
    ratio = torch.exp(log_ratio)
    token_losses = -adv * ratio
    penalised = token_losses + kl_coef * log_ratio.abs()
    valid = mask > 0
    flat = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
    if len(flat):
        a, lp = adv[valid].detach().reshape(-1).cpu(), new[valid].detach().reshape(-1).cpu()
        cov = (a - a.mean()) * (lp - lp.mean())
        top = flat[torch.topk(cov, max(1, int(len(cov) * ratio_share)), largest=True).indices.to(flat.device)]
        rows, cols = top // adv.shape[1], top % adv.shape[1]
        token_losses = token_losses.index_put((rows, cols), penalised[rows, cols])
    loss = agg_loss(token_losses, mask, mode, **denoms)
    # verl reports the mean |log-ratio| as ppo_kl for this mode.
    return PolicyLoss(loss, token_losses, _zero(loss), masked_mean(log_ratio.abs(), mask), _zero(loss))


def compute_policy_loss_by_mode(loss_mode: str, old: torch.Tensor, new: torch.Tensor, adv: torch.Tensor,
                                mask: torch.Tensor, *, low: float, high: float, clip_ratio_c: float,
                                loss_agg_mode: str, params=None, token_denominator: Denom = None,
                                seq_denominator: Denom = None, loss_scale_factor: float | None = None) -> PolicyLoss:
    """The policy loss of ``loss_mode``; ``params`` carries the cov modes' knobs (``PolicyLossConfig``)."""
    d = {"token_denominator": token_denominator, "seq_denominator": seq_denominator,
         "loss_scale_factor": loss_scale_factor}
    if loss_mode == "vanilla":
        return compute_policy_loss(old, new, adv, mask, low, high, clip_ratio_c, loss_agg_mode, **d)
    if loss_mode == "gspo":
        return gspo(old, new, adv, mask, low, high, loss_agg_mode, **d)
    if loss_mode == "gpg":
        return gpg(old, new, adv, mask, loss_agg_mode, **d)
    if loss_mode == "cispo":
        return cispo(old, new, adv, mask, low, high, loss_agg_mode, **d)
    if loss_mode == "geo_mean":
        return geo_mean(old, new, adv, mask, low, high, seq_denominator=seq_denominator)
    if loss_mode == "clip_cov":
        return clip_cov(old, new, adv, mask, low, high, loss_agg_mode, params.clip_cov_ratio, params.clip_cov_lb,
                        params.clip_cov_ub, **d)
    if loss_mode == "kl_cov":
        return kl_cov(old, new, adv, mask, loss_agg_mode, params.kl_cov_ratio, params.ppo_kl_coef, **d)
    raise ValueError(f"actor.policy_loss.loss_mode={loss_mode!r} is not valid; choose one of {list(POLICY_LOSS_MODES)}")
