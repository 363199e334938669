"""Trainer and rollout agree on CPU: the hf rollout's log-probs of its own samples against the
trainer's old log-probs (``rollout_corr/*``), in a short ``grpo_tiny`` job on 2 CPU ranks.

Error model of the bound. Both sides are fp32 and, after the weight sync, hold bitwise-equal
weights; they compute the same function in a different order (the rollout decodes token by token
with a KV cache, the trainer runs one forward of the whole sequence through DeepSpeed), so a
logit differs by reduction-order rounding only: a few ulps of the sums it is made of, u = 2^-24
(6e-8) relative, grown through 2 layers of hidden 64 to ~1e-6 of |logit| ~ 10. log-softmax moves
by at most twice the largest logit change, so a per-token disagreement above 1e-4 is not
rounding (measured: <= 8.3e-6 over 10 steps, fixtures/goldens/grpo_tiny_cpu.json). k3 per token is
e^x - 1 - x <= x^2/2 * e^|x| for x the log-ratio, so with |x| <= 1e-4 its mean is below 5.1e-9 (and above -1e-12: fp32 rounding of
expm1(x) - x at |x| ~ 1e-6, ulp(x) ~ 1e-13).

A rollout that keeps the weights of before the update (``REPRO_FAULT_STALE_ROLLOUT=1``: the
trainer skips every weight sync after the first) samples from a policy one update old. Measured with it (this test, 2026-11-26): step 2 log-prob
abs-diff max 0.82 and k3 4.5e-3, step 3 1.19 and 1.4e-2, against 1.7e-6 and 8e-14 at step 1 (synced):
the test fails at step 2, four orders of magnitude past the bound.
"""

from __future__ import annotations

from tests import jobs
from tests.jobs import SMALL

ABS_DIFF_MAX = 1e-4
K3_MAX = 0.5 * ABS_DIFF_MAX**2 * 1.001


def test_hf_rollout_log_probs_match_the_trainers_every_step(tmp_path, ray_head):
    out = tmp_path / "corr"
    # Three steps: the second and third sample with weights synced after an update.
    jobs.run_job("grpo_tiny", [*SMALL, "trainer.total_training_steps=3", "trainer.test_freq=-1",
                               "trainer.save_freq=-1", "actor_rollout_ref.rollout.calculate_log_probs=True",
                               f"trainer.output_dir={out}"], tmp_path / "outputs", ray_address=ray_head)
    rows = jobs.check_outputs(out, 3, ("rollout_corr/k3_kl", "rollout_corr/log_prob_abs_diff_max"))
    for step, row in enumerate(rows, start=1):
        diff, k3 = row["rollout_corr/log_prob_abs_diff_max"], row["rollout_corr/k3_kl"]
        assert diff <= ABS_DIFF_MAX, f"step {step}: trainer and rollout log-probs differ by {diff:.3g}"
        assert -1e-12 <= k3 <= K3_MAX, f"step {step}: rollout_corr/k3_kl {k3:.3g} > {K3_MAX:.3g}"
        assert abs(row["rollout_corr/training_ppl"] - row["rollout_corr/rollout_ppl"]) < 1e-3
