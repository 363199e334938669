"""repro.rl.advantages against verl 0.9.1's registered advantage estimators (``get_adv_estimator_fn``).

Each estimator by its verl config name, on groups of every size (one sample included) and empty
responses; equal within 1e-6 on the response tokens (both zero the rest). ``remax`` also gets its
greedy baseline, one score per prompt (some equal to a sample's score) repeated over the prompt's
samples, as verl's trainer passes ``reward_baselines``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos

from repro.rl.advantages import ADV_ESTIMATORS, compute_advantage
from tests.verl_parity.inputs import close, group_index, token_batches, whiten_magnitude

OUTCOME = [name for name in ADV_ESTIMATORS if name != "gae"]


# Estimators whose arithmetic is not verl's in verl's order; the others compare bitwise.
SUMMED_IN_ANOTHER_ORDER = ("rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")


@pytest.mark.parametrize("name", OUTCOME)
@given(data=st.data(), norm=st.booleans(), gamma=st.sampled_from([1.0, 0.9]), sparse=st.booleans())
def test_outcome_estimator_matches_verl(name, data, norm, gamma, sparse):
    # Inputs each estimator accepts, built rather than assumed (no health check under any seed):
    # grpo_passk needs groups of >= 2 samples, the reinforce++ pair >= 2 response tokens to whiten.
    passk = name == "grpo_passk"
    whitens = name in ("reinforce_plus_plus", "reinforce_plus_plus_baseline")
    batch = data.draw(token_batches(poison=False, min_rows=2 if passk else 1, min_tokens=2 if whitens else 0))
    rows = batch.shape[0]
    index = group_index(data.draw, rows, min_group=2 if passk else 1)
    rewards = batch.values * batch.mask
    if sparse:  # outcome rewards: one score on the last response token, many exact zeros (gpg counts them)
        rewards = rewards.round()
    extra = {}
    if name == "remax":  # verl passes reward_baselines only when the batch has them (grpo takes no **kwargs)
        greedy = data.draw(st.lists(st.sampled_from([0.0, 1.0, -0.5, 2.25]), min_size=4, max_size=4))
        extra["reward_baselines"] = torch.tensor([greedy[i] for i in index])
    ours = compute_advantage(name, rewards, batch.mask, index, gamma=gamma, norm_adv_by_std_in_grpo=norm, **extra)
    fn = core_algos.get_adv_estimator_fn(name)
    config = AlgoConfig(gamma=gamma, norm_adv_by_std_in_grpo=norm)
    theirs = fn(token_level_rewards=rewards.clone(), response_mask=batch.mask, index=np.array(index),
                norm_adv_by_std_in_grpo=norm, config=config, **extra)
    keep = batch.mask.bool()
    terms, magnitude = 0, None
    if name in SUMMED_IN_ANOTHER_ORDER:
        # Row scores sum the width, group baselines the rows, whitening the N tokens twice (mean,
        # variance): rloo's leave-one-out mean and the reinforce++ whitening regroup those sums.
        rows, width = batch.shape
        terms = 2 * int(keep.sum()) + width + rows + 4
        x = ours[1] if name == "reinforce_plus_plus" else rewards.sum(-1, keepdim=True).expand_as(batch.mask)
        magnitude = whiten_magnitude(x, batch.mask) + float(theirs[0][keep].abs().amax()) if keep.any() else 0.0
    close(ours[0][keep], theirs[0][keep], terms, magnitude)
    close(ours[1][keep], theirs[1][keep], terms, magnitude)


@given(data=st.data(), batch=token_batches(poison=False))
def test_grpo_passk_refuses_a_group_of_one_like_verl(data, batch):
    index = list(range(batch.shape[0]))
    with pytest.raises(ValueError, match="rollout.n >= 2"):
        compute_advantage("grpo_passk", batch.values, batch.mask, index)
    with pytest.raises(ValueError, match="at least 2 samples"):
        core_algos.compute_grpo_passk_outcome_advantage(batch.values, batch.mask, np.array(index),
                                                        config=AlgoConfig())
