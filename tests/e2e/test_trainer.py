"""Short GRPO and PPO runs of the tiny policy on 2 CPU ranks through Ray (the lossless resume after a
kill -9 is in test_run_safety.py, on the same job as the kill -9 cleanup).

Each run is a real job in a subprocess (Ray, DeepSpeed ZeRO-2 on gloo, the hf rollout), built
from the ``grpo_tiny`` / ``ppo_tiny`` presets shrunk to a few small steps (``jobs.SMALL``), started
and checked by the job harness ``tests/jobs.py``. One 3-step GRPO job (the module fixture
``grpo_run``) serves two tests: what a run writes, and trainer and rollout agreeing on log-probs
(until 2026-11-27 a 2-step and a 3-step job of their own; the module runs on one xdist worker, the
root conftest's ``_ONE_WORKER_MODULES``, so the job runs once).

Error model of the rollout-agreement bound. Both sides are fp32 and, after the weight sync, hold
bitwise-equal weights; they compute the same function in a different order (the rollout decodes token
by token with a KV cache, the trainer runs one forward of the whole sequence through DeepSpeed), so a
logit differs by reduction-order rounding only: a few ulps of the sums it is made of, u = 2^-24
(6e-8) relative, grown through 2 layers of hidden 64 to ~1e-6 of |logit| ~ 10. log-softmax moves
by at most twice the largest logit change, so a per-token disagreement above 1e-4 is not
rounding (measured: <= 8.3e-6 over 10 steps, fixtures/goldens/grpo_tiny_cpu.json). k3 per token is
e^x - 1 - x <= x^2/2 * e^|x| for x the log-ratio, so with |x| <= 1e-4 its mean is below 5.1e-9 (and above -1e-12: fp32 rounding of
expm1(x) - x at |x| ~ 1e-6, ulp(x) ~ 1e-13).

A rollout that keeps the weights of before the update (``REPRO_FAULT_STALE_ROLLOUT=1``: the
trainer skips every weight sync after the first) samples from a policy one update old. Measured with it (the
rollout-agreement test, 2026-11-26): step 2 log-prob abs-diff max 0.82 and k3 4.5e-3, step 3 1.19 and 1.4e-2,
against 1.7e-6 and 8e-14 at step 1 (synced): the test fails at step 2, four orders of magnitude past the bound.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from repro.bench.profile_phases import attribute
from tests import jobs
from tests.jobs import SMALL

ABS_DIFF_MAX = 1e-4
K3_MAX = 0.5 * ABS_DIFF_MAX**2 * 1.001


@dataclass
class GrpoRun:
    proc: subprocess.CompletedProcess
    out: Path  # the run folder
    done: Path  # the finished run of the same experiment that was there before


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory: pytest.TempPathFactory, ray_head: str) -> GrpoRun:
    """Three steps: a metrics row per step, validation before training and at steps 2 and 3, step 2
    profiled, the hf rollout's own log-probs returned (``calculate_log_probs``: the second and third
    steps sample with weights synced after an update). A finished run of the same experiment is
    already in the outputs folder: the job must say so and start anew."""
    outputs = tmp_path_factory.mktemp("grpo_run") / "outputs"
    done = outputs / "grpo_tiny_arith_20260101_000000"
    done.mkdir(parents=True)
    (done / "run.json").write_text('{"status": "finished", "last_step": 60}')
    proc = jobs.run_job("grpo_tiny", [*SMALL, "trainer.total_training_steps=3", "trainer.test_freq=2",
                                      "trainer.save_freq=-1", "trainer.profile_steps=[2]",
                                      "actor_rollout_ref.rollout.calculate_log_probs=True"], outputs,
                        ray_address=ray_head)
    [out] = [d for d in outputs.iterdir() if d != done]
    return GrpoRun(proc, out, done)


def test_grpo_run_writes_finite_metrics_and_outputs(grpo_run):
    proc, out, done = grpo_run.proc, grpo_run.out, grpo_run.done
    rows = jobs.check_outputs(out, 3, ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy",
                                       "timing_s/old_log_prob", "timing_s/update_actor", "timing_s/update_weights",
                                       "perf/max_memory_reserved_gb"))
    assert "critic/vf_loss" not in rows[0] and "timing_s/values" not in rows[0]
    assert isinstance(rows[-1]["val/score/mean"], float) and rows[0]["val/score/mean"] is None
    # Validation before training runs on the warm-started policy (~0.3 greedy accuracy), not on
    # the rollout copy's initial weights: a missing weight sync shows up as ~0 here.
    assert jobs.summary(out)["val_before_train"] > 0.1
    log = (out / "train.log").read_text()
    assert "finished 3 step(s)" in log
    # trainer.profile_steps=[2]: every rank's step 2 under torch.profiler, steps 1 and 3 not.
    assert sorted(p.name for p in (out / "profile").iterdir()) == [
        f"step2_rank{r}.{ext}" for r in (0, 1) for ext in ("trace.json", "txt")]
    for r in (0, 1):
        assert (out / "profile" / f"step2_rank{r}.txt").read_text().startswith(f"step 2, rank {r}:")
    assert f"step 2 profiled: {out / 'profile' / 'step2_rank0.txt'}" in log
    # the ranks' modules carried the phase labels (repro.workers.profiling): the step splits into them
    phases = attribute(json.loads((out / "profile" / "step2_rank0.trace.json").read_text()))["phases"]
    assert all(phases.get(p, 0) > 0 for p in ("attention", "mlp", "lm_head", "logprob", "optimizer")), phases
    # What it continues or not, and its setup, on the console and in train.log alike.
    for text in (proc.stderr, log):
        assert f"the previous run of this experiment finished (60 steps) in {done}; this is a new run in {out}" in text
        assert "setup: DeepSpeed engine (deepspeed), grpo, 2 CPU rank(s) on 1 node(s)" in text
        assert ("actor: ZeRO-2, offload (read back) optimizer=device param=device, dp 2 x sp 1, micro 8 x GAS 1 "
                "per rank, 2 mini-batch(es) x 2 epoch(s)/step, remove-padding off, LoRA off") in text
        assert "rollout: hf, 8 prompts x n=4" in text
        # the rollout the ranks built, read back from them (HybridWorker.engine_setup)
        assert "built (read back): HFRollout (Qwen3ForCausalLM)" in text
    assert "Token authentication" not in proc.stderr


def test_hf_rollout_log_probs_match_the_trainers_every_step(grpo_run):
    """Trainer and rollout agree on CPU: the hf rollout's log-probs of its own samples against the
    trainer's old log-probs (``rollout_corr/*``), within the error model of the module docstring."""
    rows = jobs.check_outputs(grpo_run.out, 3, ("rollout_corr/k3_kl", "rollout_corr/log_prob_abs_diff_max"))
    for step, row in enumerate(rows, start=1):
        diff, k3 = row["rollout_corr/log_prob_abs_diff_max"], row["rollout_corr/k3_kl"]
        assert diff <= ABS_DIFF_MAX, f"step {step}: trainer and rollout log-probs differ by {diff:.3g}"
        assert -1e-12 <= k3 <= K3_MAX, f"step {step}: rollout_corr/k3_kl {k3:.3g} > {K3_MAX:.3g}"
        assert abs(row["rollout_corr/training_ppl"] - row["rollout_corr/rollout_ppl"]) < 1e-3


def test_ppo_run_trains_actor_and_critic(ppo_3_step_run):
    # The session's 3-step PPO job (conftest's ppo_3_step_run), which test_checkpoint_fallback also
    # reads for its keep limits: a checkpoint every step changes no metric checked here.
    ppo_3_step_run.start()
    out = ppo_3_step_run.wait()
    assert "critic: ZeRO-2, offload (read back) optimizer=device param=device, dp 2 x sp 1" in ppo_3_step_run.output()
    jobs.check_outputs(out, 3, ("actor/pg_loss", "critic/vf_loss", "critic/values/mean", "critic/returns/mean",
                                "critic/grad_norm", "timing_s/values", "timing_s/update_critic", "perf/mfu/critic"))
