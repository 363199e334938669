"""repro.rl.advantages beyond what verl's own functions check (``tests/verl_parity``): the inputs an
estimator needs are demanded with one clear error, and ReMax's baseline is the greedy score."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from repro.rl.advantages import compute_advantage


def test_remax_without_greedy_baselines_is_one_clear_error():
    rewards, mask = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(ValueError, match="adv_estimator=remax needs reward_baselines"):
        compute_advantage("remax", rewards, mask, [0, 0])


@given(lengths=st.lists(st.integers(0, 4), min_size=1, max_size=6), data=st.data())
def test_remax_advantage_is_the_score_minus_the_greedy_score_on_every_response_token(lengths, data):
    """An outcome reward on the last response token: every response token gets score - baseline."""
    rows = len(lengths)
    scores = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 0.1, 1.0]), min_size=rows, max_size=rows)))
    greedy = torch.tensor(data.draw(st.lists(st.sampled_from([0.0, 0.1, 1.0]), min_size=rows, max_size=rows)))
    mask = (torch.arange(4).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).float()
    rewards = torch.zeros(rows, 4)
    for i, n in enumerate(lengths):
        if n:
            rewards[i, n - 1] = scores[i]
    adv, returns = compute_advantage("remax", rewards, mask, list(range(rows)), reward_baselines=greedy)
    torch.testing.assert_close(adv, (scores - greedy).unsqueeze(-1) * mask)
    torch.testing.assert_close(returns, scores.unsqueeze(-1) * mask)
