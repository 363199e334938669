"""verl's algorithm set end to end: every outcome advantage estimator, policy loss, new loss mode
and a straight-through KL kind, selected by verl's config keys, in real 2-step jobs (2 CPU ranks
through Ray, ZeRO-2, the hf rollout). Seven runs cover them all, paired up to keep CI short
(``remax`` alone: its greedy baseline rollout is the part under test). Their
math is checked against verl itself in ``tests/verl_parity``; these prove the keys reach the
trainer and the workers and the runs train (finite losses, varied advantages)."""

from __future__ import annotations

import pytest

from tests.distributed.test_trainer import _check_outputs, _run

ACTOR = "actor_rollout_ref.actor"
CASES = {
    "rloo-gspo": ["algorithm.adv_estimator=rloo", f"{ACTOR}.policy_loss.loss_mode=gspo",
                  f"{ACTOR}.loss_agg_mode=seq-mean-token-mean", f"{ACTOR}.entropy_coeff=0.001"],
    "rpp-gpg": ["algorithm.adv_estimator=reinforce_plus_plus", f"{ACTOR}.policy_loss.loss_mode=gpg",
                f"{ACTOR}.loss_agg_mode=token-sum"],
    "rppb-cispo": ["algorithm.adv_estimator=reinforce_plus_plus_baseline", f"{ACTOR}.policy_loss.loss_mode=cispo",
                   f"{ACTOR}.loss_agg_mode=seq-mean-token-sum-norm", f"{ACTOR}.loss_scale_factor=16"],
    "opo-geo_mean": ["algorithm.adv_estimator=opo", f"{ACTOR}.policy_loss.loss_mode=geo_mean"],
    "gpg-clip_cov": ["algorithm.adv_estimator=gpg", f"{ACTOR}.policy_loss.loss_mode=clip_cov",
                     f"{ACTOR}.policy_loss.clip_cov_ratio=0.2", f"{ACTOR}.policy_loss.clip_cov_lb=-1.0",
                     f"{ACTOR}.use_kl_loss=true", f"{ACTOR}.kl_loss_type=k3+"],
    "passk-kl_cov": ["algorithm.adv_estimator=grpo_passk", f"{ACTOR}.policy_loss.loss_mode=kl_cov",
                     f"{ACTOR}.policy_loss.kl_cov_ratio=0.2", "algorithm.use_kl_in_reward=true",
                     "algorithm.kl_penalty=k1+", "algorithm.kl_ctrl.type=adaptive"],
    # With validation of 2 sampled responses per problem: verl's val-core / val-aux metrics.
    "remax": ["algorithm.adv_estimator=remax", "trainer.test_freq=2", "actor_rollout_ref.rollout.val_kwargs.n=2",
              "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
              "actor_rollout_ref.rollout.val_kwargs.temperature=1.0"],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_verl_algorithm_runs_end_to_end(case, tmp_path):
    out = tmp_path / case
    overrides = CASES[case]
    _run("grpo_tiny", ["trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.save_freq=-1",
                       "trainer.val_before_train=false", f"trainer.output_dir={out}", *overrides], tmp_path, timeout=480)
    required = ["critic/advantages/mean", "actor/pg_loss", "actor/grad_norm", "perf/mfu/actor", "perf/mfu/actor_infer"]
    if "use_kl_loss=true" in " ".join(overrides):
        required.append("actor/kl_loss")
    if "entropy_coeff=0.001" in " ".join(overrides):
        required += ["actor/entropy_loss", "actor/entropy"]
    if "use_kl_in_reward=true" in overrides:
        required.append("actor/reward_kl_penalty_coeff")
    rows = _check_outputs(out, 2, tuple(required))
    assert any(r["critic/advantages/max"] != r["critic/advantages/min"] for r in rows)
    if case == "remax":
        # Scores are >= 0, so a negative advantage is a sample scored below its prompt's greedy
        # response: the baseline rollout reached the advantages.
        assert min(r["critic/advantages/min"] for r in rows) < 0
        val = {k.split("/reward/")[1] for k in rows[-1] if k.startswith(("val-core/", "val-aux/")) and "/reward/" in k}
        assert {"mean@2", "std@2", "best@2/mean", "worst@2/mean"} <= val, sorted(rows[-1])
    # A CPU's peak is known (448 GFLOP/s, verl's figure), so the ranks' MFU is a real fraction.
    assert all(0 < r["perf/mfu/actor"] < 1 and 0 < r["perf/mfu/actor_infer"] < 1 for r in rows)
    saved = (out / "config.yaml").read_text()
    for override in overrides:
        key, value = override.rsplit("=", 1)
        assert f"{key.rsplit('.', 1)[1]}: {value}" in saved.replace("'", ""), override
