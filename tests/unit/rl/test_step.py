"""Driver-side RL operations on the rollout batch: reward placement, KL controller."""

from __future__ import annotations

import pytest
import torch

from repro.rl.step import KLController, token_level_scores


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
