"""repro.rl.policy_losses against verl 0.9.1's registered policy losses (``get_policy_loss_fn``):
loss, gradient with respect to the log-probs, and every statistic verl reports for the mode."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig
from verl.workers.config.actor import PolicyLossConfig

from repro.rl.algorithms import LOSS_AGG_MODES
from repro.rl.policy_losses import POLICY_LOSS_MODES, compute_policy_loss_by_mode
from tests.verl_parity.inputs import close, token_batches

STATS = {"actor/pg_clipfrac": "clipfrac", "actor/ppo_kl": "ppo_kl", "actor/pg_clipfrac_lower": "clipfrac_lower"}


@pytest.mark.parametrize("loss_mode", POLICY_LOSS_MODES)
@given(batch=token_batches(poison=False, min_tokens=1), agg=st.sampled_from(list(LOSS_AGG_MODES)),
       low=st.sampled_from([0.1, 0.2]), high=st.sampled_from([0.2, 0.28]), shift=st.sampled_from([0.05, 0.5]),
       cov_ratio=st.sampled_from([0.0002, 0.3]), cov_lb=st.sampled_from([-1.0, 0.0]),
       scale=st.sampled_from([None, 7]))
def test_policy_loss_matches_verl(loss_mode, batch, agg, low, high, shift, cov_ratio, cov_lb, scale):
    old = batch.other
    new_ours = (old + shift * batch.values).detach().requires_grad_(True)
    new_theirs = new_ours.detach().clone().requires_grad_(True)
    adv = batch.other.flip(0) * batch.mask
    params = SimpleNamespace(clip_cov_ratio=cov_ratio, clip_cov_lb=cov_lb, clip_cov_ub=5.0, kl_cov_ratio=cov_ratio,
                             ppo_kl_coef=0.1)
    config = ActorConfig(strategy="fsdp", rollout_n=1, clip_ratio=low, clip_ratio_low=low, clip_ratio_high=high,
                         ppo_micro_batch_size_per_gpu=1,
                         policy_loss=PolicyLossConfig(loss_mode=loss_mode, clip_cov_ratio=cov_ratio, clip_cov_lb=cov_lb,
                                                      clip_cov_ub=5.0, kl_cov_ratio=cov_ratio, ppo_kl_coef=0.1))
    # As verl's actor loss passes actor.loss_scale_factor to every policy loss's agg_loss.
    config.global_batch_info["loss_scale_factor"] = scale
    torch.manual_seed(0)  # clip_cov draws among its candidates from the global generator
    ours = compute_policy_loss_by_mode(loss_mode, old, new_ours, adv, batch.mask, low=low, high=high,
                                       clip_ratio_c=3.0, loss_agg_mode=agg, params=params, loss_scale_factor=scale)
    torch.manual_seed(0)
    loss, stats = core_algos.get_policy_loss_fn(loss_mode)(old, new_theirs, adv, batch.mask, agg, config)
    close(ours.loss.detach(), loss.detach())
    for key, value in stats.items():
        close(getattr(ours, STATS[key]), value)
    ours.loss.backward()
    loss.backward()
    close(new_ours.grad, new_theirs.grad)
