"""repro.rl.algorithms against verl 0.9.1's own core_algos and torch_functional, on hypothesis inputs.

Edge cases drawn on purpose: GRPO groups of one sample, NaN / +-inf outside the response mask,
empty (aborted) responses, all-empty batches.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import verl.utils.torch_functional as verl_F
from hypothesis import given
from hypothesis import strategies as st
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig
from verl.workers.config.actor import PolicyLossConfig

from repro.rl import algorithms
from tests.verl_parity.inputs import (
    close,
    group_index,
    leaks_into_verl,
    token_batches,
    whiten_magnitude,
    zeroed_padding,
)

LOSS_MODES = list(algorithms.LOSS_AGG_MODES)


@given(batch=token_batches())
def test_masked_sum_and_mean_ignore_anything_outside_the_mask(batch):
    v, m = batch.values, batch.mask
    close(algorithms.masked_sum(v, m), verl_F.masked_sum(v, m))
    close(algorithms.masked_mean(v, m), verl_F.masked_mean(v, m))
    close(algorithms.masked_mean(v, m, dim=-1), verl_F.masked_mean(v, m, axis=-1))
    assert torch.isfinite(algorithms.masked_mean(v, m))


@given(batch=token_batches(min_tokens=2))
def test_masked_whiten_matches_on_the_unmasked_tokens(batch):
    keep = batch.mask.bool()
    ours = algorithms.masked_whiten(batch.values, batch.mask)
    # the mean and the variance each sum the N unmasked tokens, in another order than verl's
    close(ours[keep], verl_F.masked_whiten(batch.values, batch.mask)[keep], 2 * int(keep.sum()) + 4,
          whiten_magnitude(batch.values, batch.mask))


# verl's actor/critic ``loss_scale_factor``: seq-mean-token-sum-norm's divisor (None: the padded width).
SCALES = st.sampled_from([None, 7, 4096])  # never a drawn width (<= 5): a scale that is ignored fails


@given(batch=token_batches(min_tokens=1), mode=st.sampled_from(LOSS_MODES), scale=SCALES)
def test_agg_loss_matches_whenever_a_token_is_unmasked(batch, mode, scale):
    """On purpose, for NaN/inf outside the mask: verl 0.9.1's seq-mean modes multiply by the mask
    (``nan * 0`` is NaN) where its token-mean selects with ``torch.where``; repro selects in every
    mode, so a padded position never reaches the loss. There repro equals verl on the same batch
    with the padding zeroed, and verl itself is NaN."""
    ours = algorithms.agg_loss(batch.values, batch.mask, mode, loss_scale_factor=scale)
    assert torch.isfinite(ours)
    close(ours, core_algos.agg_loss(zeroed_padding(batch.values, batch.mask), batch.mask, mode,
                                    loss_scale_factor=scale))
    theirs = core_algos.agg_loss(batch.values, batch.mask, mode, loss_scale_factor=scale)
    if leaks_into_verl(batch.values, batch.mask, mode):
        assert torch.isnan(theirs)
    else:
        close(ours, theirs)


@given(batch=token_batches(), mode=st.sampled_from(LOSS_MODES))
def test_agg_loss_of_an_all_empty_batch_is_zero_where_verl_is_nan(batch, mode):
    """(token-sum: 0 in both.) On purpose: a micro-batch with no response token (a rank whose share is all aborted
    responses) contributes 0 to the accumulated gradient in repro; verl's local count is 0/0."""
    empty = torch.zeros_like(batch.mask)
    assert algorithms.agg_loss(batch.values, empty, mode).item() == 0.0
    theirs = core_algos.agg_loss(batch.values, empty, mode)
    assert theirs.item() == 0.0 if mode == "token-sum" else torch.isnan(theirs)


@given(data=st.data(), batch=token_batches(poison=False), norm=st.booleans())
def test_grpo_advantage_including_groups_of_one(data, batch, norm):
    rows = batch.shape[0]
    index = group_index(data.draw, rows)
    scores = batch.values.clone()
    ours, ours_ret = algorithms.compute_grpo_outcome_advantage(scores, batch.mask, index, norm)
    theirs, theirs_ret = core_algos.compute_grpo_outcome_advantage(
        scores.clone(), batch.mask, np.array(index), norm_adv_by_std_in_grpo=norm)
    close(ours, theirs)
    close(ours_ret, theirs_ret)


@given(batch=token_batches(min_tokens=2, poison=False), gamma=st.sampled_from([1.0, 0.99, 0.9]),
       lam=st.sampled_from([1.0, 0.95, 0.5]))
def test_gae_advantages_and_returns(batch, gamma, lam):
    rewards, values = batch.values, batch.other
    ours = algorithms.compute_gae_advantage_return(rewards, values, batch.mask, gamma, lam)
    theirs = core_algos.compute_gae_advantage_return(rewards, values, batch.mask, gamma, lam)
    keep = batch.mask.bool()
    # the backward recursion: three terms a step (r + gamma v' - v, then + gamma lambda A') over
    # the width, at the largest of the rewards, values and advantages
    terms = 3 * batch.shape[1] + 2
    magnitude = max(float(t[keep].abs().max()) for t in (rewards, values, theirs[0], theirs[1]))
    close(ours[0][keep], theirs[0][keep], terms, magnitude)
    close(ours[1][keep], theirs[1][keep], terms, magnitude)


def _actor_config(low: float, high: float, c: float, mode: str = "vanilla", **extra) -> ActorConfig:
    return ActorConfig(strategy="fsdp", rollout_n=1, clip_ratio=low, clip_ratio_low=low, clip_ratio_high=high,
                       clip_ratio_c=c, ppo_micro_batch_size_per_gpu=1,
                       policy_loss=PolicyLossConfig(loss_mode=mode, **extra))


@given(batch=token_batches(min_tokens=1), mode=st.sampled_from(LOSS_MODES), low=st.sampled_from([0.1, 0.2]),
       high=st.sampled_from([0.2, 0.28]), c=st.sampled_from([3.0, 10.0]), shift=st.sampled_from([0.05, 0.5]))
def test_ppo_clipped_policy_loss_and_its_statistics(batch, mode, low, high, c, shift):
    old = batch.other
    new = old + shift * torch.randn(old.shape, generator=torch.Generator().manual_seed(len(batch.lengths)))
    new = torch.where(batch.mask.bool(), new, batch.values)  # poison outside the mask, if drawn
    adv = batch.other.flip(0)
    ours = algorithms.compute_policy_loss(old, new, adv, batch.mask, low, high, c, mode)
    loss, stats = core_algos.compute_policy_loss_vanilla(old, new, adv, batch.mask, mode, _actor_config(low, high, c))
    # As in test_agg_loss_matches_whenever_a_token_is_unmasked (an inf log-prob is clamped, a NaN is not).
    if leaks_into_verl(new, batch.mask, mode) and torch.isnan(loss):
        loss, _ = core_algos.compute_policy_loss_vanilla(old, zeroed_padding(new, batch.mask), adv, batch.mask, mode,
                                                         _actor_config(low, high, c))
    close(ours.loss, loss)
    close(ours.clipfrac, stats["actor/pg_clipfrac"])
    close(ours.ppo_kl, stats["actor/ppo_kl"])
    close(ours.clipfrac_lower, stats["actor/pg_clipfrac_lower"])


@given(batch=token_batches(min_tokens=1), mode=st.sampled_from(LOSS_MODES), clip=st.sampled_from([0.1, 0.5]), scale=SCALES)
def test_clipped_value_loss(batch, mode, clip, scale):
    vpreds = torch.where(batch.mask.bool(), batch.other, batch.values)
    returns, values = batch.other.flip(0), batch.other.flip(1)
    ours = algorithms.compute_value_loss(vpreds, returns, values, batch.mask, clip, mode, loss_scale_factor=scale)
    # Non-finite padding: as in test_agg_loss_matches_whenever_a_token_is_unmasked.
    loss, clipfrac = core_algos.compute_value_loss(zeroed_padding(vpreds, batch.mask), returns, values, batch.mask,
                                                   clip, mode, loss_scale_factor=scale)
    close(ours.loss, loss)
    close(ours.clipfrac, clipfrac)
    loss, clipfrac = core_algos.compute_value_loss(vpreds, returns, values, batch.mask, clip, mode,
                                                   loss_scale_factor=scale)
    close(ours.clipfrac, clipfrac)
    if leaks_into_verl(vpreds, batch.mask, mode):
        assert torch.isnan(loss)
    else:
        close(ours.loss, loss)


@given(batch=token_batches(poison=False), kind=st.sampled_from(list(algorithms.KL_LOSS_TYPES)))
def test_kl_penalty_estimators_values_and_gradients(batch, kind):
    """Gradients too: the ``+`` kinds are straight-through (value of the kind, gradient of k2)."""
    ours_in = batch.values.clone().requires_grad_(True)
    theirs_in = batch.values.clone().requires_grad_(True)
    ours = algorithms.kl_penalty(ours_in, batch.other, kind)
    theirs = core_algos.kl_penalty(theirs_in, batch.other, kind)
    close(ours.detach(), theirs.detach())
    (ours * batch.mask).sum().backward()
    (theirs * batch.mask).sum().backward()
    close(ours_in.grad, theirs_in.grad)


@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 4), vocab=st.integers(2, 9),
       scale=st.sampled_from([0.1, 1.0, 10.0]))
def test_entropy_and_log_probs_from_logits(seed, rows, vocab, scale):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, 3, vocab, generator=gen) * scale
    labels = torch.randint(0, vocab, (rows, 3), generator=gen)
    # each token's log-sum-exp and entropy sum its vocab terms (plus shift, exp, gather,
    # subtraction), at max |logit| + log(vocab)
    terms, magnitude = vocab + 4, float(logits.abs().max()) + math.log(vocab)
    close(algorithms.entropy_from_logits(logits), verl_F.entropy_from_logits(logits), terms, magnitude)
    close(algorithms.logprobs_from_logits(logits, labels), verl_F.logprobs_from_logits(logits, labels), terms,
          magnitude)


@pytest.mark.parametrize("kind", ["fixed", "adaptive"])
@given(kls=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6), target=st.sampled_from([0.01, 0.1, 6.0]),
       horizon=st.sampled_from([100, 10000]), responses=st.integers(1, 64))
def test_kl_controller_trajectory(kind, kls, target, horizon, responses):
    from repro.rl.step import KLController

    ours = KLController(kind, 0.1, target, horizon)
    theirs = core_algos.get_kl_controller(_kl_ctrl(kind, 0.1, target, horizon))
    for kl in kls:
        ours.update(kl, responses)
        theirs.update(kl, responses)
        close(ours.value, theirs.value)


def _kl_ctrl(kind: str, coef: float, target: float, horizon: int):
    from verl.trainer.config import KLControlConfig

    return KLControlConfig(type=kind, kl_coef=coef, target_kl=target, horizon=horizon)
