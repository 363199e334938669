"""Short GRPO and PPO runs of the tiny policy on 2 CPU ranks through Ray (the lossless resume after a
kill -9 is in test_run_safety.py, on the same job as the kill -9 cleanup).

Each run is a real job in a subprocess (Ray, DeepSpeed ZeRO-2 on gloo, the hf rollout), built
from the ``grpo_tiny`` / ``ppo_tiny`` presets shrunk to a few small steps (``jobs.SMALL``), started
and checked by the job harness ``tests/jobs.py``.
"""

from __future__ import annotations

import json

from repro.bench.profile_phases import attribute
from tests import jobs
from tests.jobs import SMALL


def test_grpo_run_writes_finite_metrics_and_outputs(tmp_path, ray_head):
    # A finished run of the same experiment is already there: this one must say so and start anew.
    done = tmp_path / "outputs" / "grpo_tiny_arith_20260101_000000"
    done.mkdir(parents=True)
    (done / "run.json").write_text('{"status": "finished", "last_step": 60}')
    # Two steps: a metrics row per step, validation before training and at the last step.
    proc = jobs.run_job("grpo_tiny", [*SMALL, "trainer.total_training_steps=2", "trainer.test_freq=2",
                                      "trainer.save_freq=-1", "trainer.profile_steps=[2]"], tmp_path / "outputs",
                        ray_address=ray_head)
    [out] = [d for d in (tmp_path / "outputs").iterdir() if d != done]
    rows = jobs.check_outputs(out, 2, ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy",
                                       "timing_s/old_log_prob", "timing_s/update_actor", "timing_s/update_weights",
                                       "perf/max_memory_reserved_gb"))
    assert "critic/vf_loss" not in rows[0] and "timing_s/values" not in rows[0]
    assert isinstance(rows[-1]["val/score/mean"], float) and rows[0]["val/score/mean"] is None
    # Validation before training runs on the warm-started policy (~0.3 greedy accuracy), not on
    # the rollout copy's initial weights: a missing weight sync shows up as ~0 here.
    assert jobs.summary(out)["val_before_train"] > 0.1
    log = (out / "train.log").read_text()
    assert "finished 2 step(s)" in log
    # trainer.profile_steps=[2]: every rank's step 2 under torch.profiler, step 1 not.
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


def test_ppo_run_trains_actor_and_critic(ppo_3_step_run):
    # The session's 3-step PPO job (conftest's ppo_3_step_run), which test_checkpoint_fallback also
    # reads for its keep limits: a checkpoint every step changes no metric checked here.
    ppo_3_step_run.start()
    out = ppo_3_step_run.wait()
    assert "critic: ZeRO-2, offload (read back) optimizer=device param=device, dp 2 x sp 1" in ppo_3_step_run.output()
    jobs.check_outputs(out, 3, ("actor/pg_loss", "critic/vf_loss", "critic/values/mean", "critic/returns/mean",
                                "critic/grad_norm", "timing_s/values", "timing_s/update_critic", "perf/mfu/critic"))
