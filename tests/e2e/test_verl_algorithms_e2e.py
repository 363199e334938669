"""verl's algorithm set end to end: every outcome advantage estimator, policy loss, new loss mode
and a straight-through KL kind, selected by verl's config keys, in real 2-step jobs (2 CPU ranks
through Ray, ZeRO-2, the hf rollout). Seven runs cover them all, paired up to keep CI short
(``remax`` alone: its greedy baseline rollout is the part under test). Their
math is checked against verl itself in ``tests/verl_parity``; these prove the keys reach the
trainer and the workers and the runs train (finite losses, varied advantages).

The seven jobs run one after the other in one driver process (the job harness's runner,
``tests/jobs.py``) that joins the worker's shared Ray head (``ray_head``): start-up (imports,
``ray.init``) is paid once, not seven times; each job still builds its own config, worker group,
engines and run folder. The same driver runs an eighth job for verl's reward plug-in (a user's file
with verl's signature that returns 0.25, a score the rule reward never gives: the run's score rows
show that the plug-in, not the rule, scored it; until 2026-11-27 a driver of its own,
``test_custom_reward_run.py``). The driver is a module fixture and this module runs on one xdist
worker (the root conftest's ``_ONE_WORKER_MODULES``), so it runs once for both tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import jobs
from tests.jobs import SMALL

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


COMMON = ["trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.save_freq=-1",
          "trainer.val_before_train=false"]


def _check_case(case: str, out: Path) -> None:
    overrides = CASES[case]
    required = ["critic/advantages/mean", "actor/pg_loss", "actor/grad_norm", "perf/mfu/actor", "perf/mfu/actor_infer"]
    if "use_kl_loss=true" in " ".join(overrides):
        required.append("actor/kl_loss")
    if "entropy_coeff=0.001" in " ".join(overrides):
        required += ["actor/entropy_loss", "actor/entropy"]
    if "use_kl_in_reward=true" in overrides:
        required.append("actor/reward_kl_penalty_coeff")
    rows = jobs.check_outputs(out, 2, tuple(required))
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


REWARD = '''
def my_score(data_source, solution_str, ground_truth, extra_info=None, value=0.0):
    assert isinstance(solution_str, str) and data_source == "repro/arith"
    return value
'''
REWARD_KEY = "reward.custom_reward_function"


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory, ray_head: str) -> Iterator[Path]:
    """Every case's job and the custom-reward job, one after the other in one driver; the folder
    holding each job's status file (``<name>.status``: "ok" or its traceback) and run folder."""
    root = tmp_path_factory.mktemp("verl_algorithms")
    reward = root / "my_reward.py"
    reward.write_text(REWARD)
    # Each job is built as the CLI builds it (load_config of the preset plus overrides); a failed job
    # is recorded with its traceback in its status file and the next one still runs.
    each = [(root / f"{case}.status",
             # the case's overrides after COMMON: remax turns validation on (trainer.test_freq=2)
             [*SMALL, *COMMON, *CASES[case], f"trainer.output_dir={root / case}"]) for case in CASES]
    each.append((root / "custom-reward.status",
                 [*SMALL, *COMMON, f"{REWARD_KEY}.path={reward}", f"{REWARD_KEY}.name=my_score",
                  f"+{REWARD_KEY}.reward_kwargs.value=0.25", f"trainer.output_dir={root / 'custom-reward'}"]))
    jobs.run(jobs.runner_each_command("grpo_tiny", each), jobs.job_env(root / "outputs", ray_head),
             timeout=180 * len(each))
    yield root


@pytest.mark.slow
def test_verl_algorithms_run_end_to_end(driver):
    # One test, not one per case: a module fixture shared by parametrised tests would run the
    # driver once per xdist worker that receives a case unless the module is held on one worker
    # (it is now, for the custom-reward test), and one test keeps every case's failure in one
    # report. Every case is checked; the failure lists each failing case with its own error.
    failures = {}
    for case in CASES:
        status = (driver / f"{case}.status").read_text()
        try:
            assert status == "ok", f"the run failed:\n{status[-4000:]}"
            _check_case(case, driver / case)
        except AssertionError as e:
            failures[case] = str(e)
    assert not failures, "\n\n".join(f"{case}: {err}" for case, err in failures.items())


@pytest.mark.slow
def test_custom_reward_function_scores_a_real_run(driver):
    status = (driver / "custom-reward.status").read_text()
    assert status == "ok", f"the run failed:\n{status[-4000:]}"
    rows = jobs.metrics(driver / "custom-reward")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["critic/score/mean"] == 0.25 for r in rows), [r["critic/score/mean"] for r in rows]
