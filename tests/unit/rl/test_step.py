"""Driver-side RL operations on the rollout batch: reward placement, KL controller."""

from __future__ import annotations

import math

import pytest
import torch

from repro.rl.step import KLController, rollout_corr_metrics, token_level_scores


def test_score_lands_on_last_real_response_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    out = token_level_scores(torch.tensor([0.5, 1.0, 0.1]), mask)
    assert out.tolist() == [[0, 0, 0.5, 0], [0, 0, 0, 1.0], [pytest.approx(0.1), 0, 0, 0]]


def test_adaptive_kl_coef_grows_above_target_and_shrinks_below():
    up = KLController("adaptive", 0.1, target_kl=0.1, horizon=100)
    up.update(current_kl=1.0, n_steps=10)
    down = KLController("adaptive", 0.1, target_kl=0.1, horizon=100)
    down.update(current_kl=0.0, n_steps=10)
    fixed = KLController("fixed", 0.1, target_kl=0.1, horizon=100)
    fixed.update(current_kl=1.0, n_steps=10)
    assert up.value == pytest.approx(0.1 * 1.02) and down.value == pytest.approx(0.1 * 0.98)
    assert fixed.value == 0.1


def test_rollout_corr_is_zero_for_equal_log_probs_and_ignores_padding():
    lp = torch.tensor([[-0.1, -2.0, 0.0], [-0.7, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    junk = lp + (1 - mask) * 5.0  # padding differs wildly; only response tokens count
    m = rollout_corr_metrics(lp, junk, mask)
    assert m["rollout_corr/kl"] == 0.0 and m["rollout_corr/k3_kl"] == 0.0
    assert m["rollout_corr/log_prob_abs_diff_max"] == 0.0
    assert m["rollout_corr/training_ppl"] == pytest.approx(torch.exp(torch.tensor(2.8 / 3)).item())


def test_rollout_corr_k3_matches_its_closed_form_and_grows_with_the_gap():
    # One token, train log-prob t, rollout log-prob r: k3 = e^(t-r) - 1 - (t-r), kl = r - t.
    mask = torch.ones(1, 1)
    small = rollout_corr_metrics(torch.tensor([[-1.0]]), torch.tensor([[-1.01]]), mask)
    large = rollout_corr_metrics(torch.tensor([[-1.0]]), torch.tensor([[-2.0]]), mask)
    assert small["rollout_corr/k3_kl"] == pytest.approx(math.expm1(0.01) - 0.01, rel=1e-4)
    assert large["rollout_corr/k3_kl"] == pytest.approx(math.e - 2.0, rel=1e-5)
    assert small["rollout_corr/kl"] == pytest.approx(-0.01, abs=1e-6) and large["rollout_corr/kl"] == pytest.approx(-1.0)
    assert large["rollout_corr/k3_kl"] > 100 * small["rollout_corr/k3_kl"]
