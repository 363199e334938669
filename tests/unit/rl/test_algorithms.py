"""Advantages, losses, KL estimators, entropy and masked reductions of repro.rl.algorithms."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.rl.algorithms import (
    LOSS_AGG_MODES,
    agg_loss,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_policy_loss,
    compute_value_loss,
    entropy_from_logits,
    kl_penalty,
    logprobs_from_logits,
    masked_mean,
    masked_whiten,
)
from tests.error_model import FP32_EPS, float_tol


def _right_padded_mask(lengths: list[int], width: int) -> torch.Tensor:
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()


def test_masked_mean_ignores_masked_entries():
    values = torch.tensor([[1.0, 2.0, 1000.0], [3.0, -1000.0, -1000.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert masked_mean(values, mask).item() == pytest.approx(2.0)
    assert masked_mean(values, mask, dim=-1).tolist() == pytest.approx([1.5, 3.0])


def test_masked_whiten_gives_zero_mean_unit_variance():
    torch.manual_seed(0)
    values = torch.randn(4, 6) * 3 + 2
    mask = _right_padded_mask([6, 4, 3, 1], 6)
    out = masked_whiten(values, mask)
    # fp32: the whitening (mean, variance) and the checks (mean, variance) each sum the N real
    # entries, about 4N accumulations of values up to max|out| (squared for the variance).
    n, m = int(mask.sum()), float(out[mask.bool()].abs().max())
    assert masked_mean(out, mask).item() == pytest.approx(0.0, abs=float_tol(4 * n, m))
    picked = out[mask.bool()]
    assert picked.var().item() == pytest.approx(1.0, abs=float_tol(4 * n, m * m))


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 6), min_size=1, max_size=8),
    cuts=st.lists(st.integers(1, 7), min_size=0, max_size=4),
    mode=st.sampled_from(list(LOSS_AGG_MODES)),
    seed=st.integers(0, 1000),
)
def test_micro_batch_losses_with_global_denominators_sum_to_the_full_loss(lengths, cuts, mode, seed):
    gen = torch.Generator().manual_seed(seed)
    loss_mat = torch.randn(len(lengths), 6, generator=gen)
    mask = _right_padded_mask(lengths, 6)
    full = agg_loss(loss_mat, mask, mode)
    bounds = sorted({c for c in cuts if c < len(lengths)} | {0, len(lengths)})
    tokens, seqs = mask.sum(), max(sum(n > 0 for n in lengths), 1)
    total = sum(
        agg_loss(loss_mat[a:b], mask[a:b], mode, token_denominator=tokens.clamp(min=1), seq_denominator=seqs)
        for a, b in zip(bounds, bounds[1:], strict=False)
    )
    # The same terms summed in one pass or per micro-batch, then divided: at most every token and
    # every partial sum, plus the divisions, accumulate rounding of values up to max|loss|.
    terms = int(mask.sum()) + len(bounds) + 4
    assert total.item() == pytest.approx(full.item(), abs=float_tol(terms, float(loss_mat.abs().max())))


def test_agg_loss_modes_on_a_hand_example():
    loss_mat = torch.tensor([[1.0, 3.0, 0.0], [2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert agg_loss(loss_mat, mask, "token-mean").item() == pytest.approx(2.0)
    assert agg_loss(loss_mat, mask, "seq-mean-token-sum").item() == pytest.approx(3.0)
    assert agg_loss(loss_mat, mask, "seq-mean-token-mean").item() == pytest.approx(2.0)
    assert agg_loss(loss_mat, mask, "token-sum").item() == pytest.approx(6.0)
    assert agg_loss(loss_mat, mask, "seq-mean-token-sum-norm").item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        agg_loss(loss_mat, mask, "sum")


def test_grpo_advantage_normalises_within_each_prompt_group():
    rewards = torch.zeros(5, 3)
    rewards[:, -1] = torch.tensor([1.0, 0.0, 1.0, 0.5, 7.0])
    mask = torch.ones(5, 3)
    mask[1, 2] = 0
    adv, ret = compute_grpo_outcome_advantage(rewards, mask, ["a", "a", "b", "b", "c"], True)
    std_a = torch.tensor([1.0, 0.0]).std().item()
    # fp32 group statistics over a handful of scores: a few eps relative (16 eps is ample).
    assert adv[0, 0].item() == pytest.approx(0.5 / (std_a + 1e-6), rel=16 * FP32_EPS)
    assert adv[1, 0].item() == pytest.approx(-0.5 / (std_a + 1e-6), rel=16 * FP32_EPS)
    assert adv[1, 2].item() == 0.0  # masked token
    assert adv[4].tolist() == pytest.approx([7.0 / (1 + 1e-6)] * 3)  # singleton group: mean 0, std 1
    assert torch.equal(adv, ret)
    unnorm, _ = compute_grpo_outcome_advantage(rewards, mask, torch.tensor([0, 0, 1, 1, 2]), False)
    assert unnorm[2, 0].item() == pytest.approx(0.25)


def _naive_gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    adv, running = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        nxt = values[t + 1] if t + 1 < len(rewards) else 0.0
        running = rewards[t] + gamma * nxt - values[t] + gamma * lam * running
        adv[t] = running
    return adv


@settings(max_examples=20, deadline=None)
@given(lengths=st.lists(st.integers(1, 5), min_size=2, max_size=4), gamma=st.floats(0.5, 1.0),
       lam=st.floats(0.5, 1.0), seed=st.integers(0, 100))
def test_gae_matches_per_sequence_recursion_on_right_padded_responses(lengths, gamma, lam, seed):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(len(lengths), 5, generator=gen, dtype=torch.float64)
    values = torch.randn(len(lengths), 5, generator=gen, dtype=torch.float64)
    mask = _right_padded_mask(lengths, 5).double()
    adv, ret = compute_gae_advantage_return(rewards * mask, values, mask, gamma, lam)
    raw = torch.zeros_like(values)
    for i, n in enumerate(lengths):
        raw[i, :n] = torch.tensor(_naive_gae(rewards[i, :n].tolist(), values[i, :n].tolist(), gamma, lam),
                                  dtype=torch.float64)
    # fp64: the recursion runs up to 5 steps of a few operations; whitening sums the N entries
    # twice; values up to max|raw| (whitened values up to max|adv|).
    m = max(float(raw.abs().max()), float(adv.abs().max()), 1.0)
    tol = float_tol(4 * int(mask.sum()) + 20, m, torch.float64)
    assert torch.allclose((ret - values) * mask, raw * mask, rtol=0, atol=tol)
    assert torch.allclose(adv, masked_whiten(raw, mask) * mask, rtol=0, atol=tol)


def test_policy_loss_without_ratio_change_is_minus_mean_advantage():
    adv = torch.tensor([[1.0, -2.0, 3.0]])
    lp = torch.tensor([[-1.0, -2.0, -0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    out = compute_policy_loss(lp, lp, adv, mask)
    assert out.loss.item() == pytest.approx(0.5)
    assert out.clipfrac.item() == 0.0 and out.ppo_kl.item() == 0.0


def test_policy_loss_clips_and_dual_clips():
    old = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[1.5, 0.5, 10.0]]))
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    out = compute_policy_loss(old, new, adv, torch.ones(1, 3), 0.2, 0.28, 3.0)
    # token 0: ratio 1.5 clipped to 1.28 -> -1.28; token 1: ratio 0.5, min(-0.5, -0.8) kept as
    # max(-0.5, -0.8) = -0.5; token 2: A<0, ratio 10 -> loss 10, dual clip caps it at 3.
    assert out.token_losses.tolist() == [pytest.approx([-1.28, -0.5, 3.0])]
    assert out.clipfrac.item() == pytest.approx(1 / 3)  # token 0 only (token 1 not clipped)
    assert out.clipfrac_lower.item() == pytest.approx(1 / 3)


def test_value_loss_uses_the_larger_of_clipped_and_unclipped():
    vpreds = torch.tensor([[2.0, 0.1]])
    values = torch.tensor([[0.0, 0.0]])
    returns = torch.tensor([[3.0, 0.0]])
    out = compute_value_loss(vpreds, returns, values, torch.ones(1, 2), cliprange_value=0.5)
    # token 0: unclipped (2-3)^2=1, clipped (0.5-3)^2=6.25 -> 6.25; token 1: 0.01 both.
    assert out.loss.item() == pytest.approx(0.5 * (6.25 + 0.01) / 2)
    assert out.clipfrac.item() == pytest.approx(0.5)


def test_kl_estimators():
    lp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.5, -1.0])
    assert kl_penalty(lp, ref, "kl").tolist() == pytest.approx([0.5, -1.0])
    assert kl_penalty(lp, ref, "k1").tolist() == pytest.approx([0.5, -1.0])
    assert kl_penalty(lp, ref, "abs").tolist() == pytest.approx([0.5, 1.0])
    assert kl_penalty(lp, ref, "k2").tolist() == pytest.approx([0.125, 0.5])
    k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]
    assert kl_penalty(lp, ref, "low_var_kl").tolist() == pytest.approx(k3)
    assert kl_penalty(lp, lp, "k3").abs().sum().item() == 0.0
    with pytest.raises(ValueError, match="low_var_kl"):
        kl_penalty(lp, ref, "k4")


def test_entropy_and_logprobs_match_torch_categorical():
    torch.manual_seed(1)
    logits = torch.randn(3, 4, 7)
    labels = torch.randint(0, 7, (3, 4))
    dist = torch.distributions.Categorical(logits=logits)
    # Both reduce over the V=7 vocabulary entries (logsumexp, then the entropy's sum), values up to
    # max|logit| + log V: V + 4 accumulations in fp32.
    tol = float_tol(7 + 4, float(logits.abs().max()) + math.log(7))
    assert torch.allclose(entropy_from_logits(logits), dist.entropy(), rtol=0, atol=tol)
    assert torch.allclose(logprobs_from_logits(logits, labels), dist.log_prob(labels), rtol=0, atol=tol)
    assert entropy_from_logits(torch.zeros(5)).item() == pytest.approx(math.log(5))
