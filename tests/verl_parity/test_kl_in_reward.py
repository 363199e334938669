"""repro.rl.step.apply_kl_penalty against verl 0.9.1's ray_trainer.apply_kl_penalty.

The point of this check: the adaptive controller must advance by the number of *responses*
(verl's batch size, ``rollout.n`` per prompt), not by the number of prompts.
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import apply_kl_penalty as verl_apply_kl_penalty

from repro.rl.step import KLController, apply_kl_penalty
from tests.verl_parity.inputs import close, token_batches


@given(batch=token_batches(poison=False), steps=st.integers(1, 3), kind=st.sampled_from(["kl", "k1", "abs", "k2", "k3"]),
       target=st.sampled_from([0.001, 0.1]))
def test_kl_penalised_rewards_metrics_and_adaptive_coefficient(batch, steps, kind, target):
    scores = torch.zeros_like(batch.mask)
    scores[:, -1] = batch.other[:, 0]
    tensors = {"response_mask": batch.mask, "token_level_scores": scores,
               "old_log_probs": batch.values, "ref_log_prob": batch.other}
    ours = KLController("adaptive", 0.2, target, 100)
    theirs = core_algos.AdaptiveKLController(0.2, target, 100)
    for _ in range(steps):
        rewards, metrics = apply_kl_penalty(tensors, ours, kind)
        data, verl_metrics = verl_apply_kl_penalty(DataProto.from_dict({k: v.clone() for k, v in tensors.items()}),
                                                   theirs, kind)
        close(rewards, data.batch["token_level_rewards"])
        assert metrics.keys() == verl_metrics.keys()
        for key in metrics:
            close(metrics[key], verl_metrics[key])
        close(ours.value, theirs.value)
