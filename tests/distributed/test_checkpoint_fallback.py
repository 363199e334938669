"""A damaged latest checkpoint through the real trainer: fallback, named files, equal metrics.

A tiny GRPO job (Ray, 2 CPU ranks, DeepSpeed ZeRO-2) runs 4 steps saving at 2 and 4, with the
actor's Hugging Face export in its checkpoints (``save_contents`` with ``hf_model``). Then a
DeepSpeed optimizer shard of ``global_step_4`` is truncated and the ``latest`` marker emptied;
the same command again must verify, name both, keep ``global_step_4.damaged``, resume from
``global_step_2`` and recompute steps 3-4 equal to the first run.
"""

from __future__ import annotations

import json

import pytest

from repro.run.checkpoints import MANIFEST, MARKER
from tests import jobs
from tests.jobs import SMALL

HF = "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"


@pytest.mark.slow  # two real jobs one after the other: about 2-3 min on 2 loaded cores
def test_damaged_latest_checkpoint_falls_back_and_recomputes_equal_metrics(tmp_path, ray_head):
    out = tmp_path / "run"
    # No validation (before training or at test_freq): the claims are about checkpoints and the
    # training rows; validation is proven in test_trainer's GRPO run. It was 256 generations, 8
    # times a SMALL step's 32.
    command = [*SMALL, "trainer.total_training_steps=4", "trainer.save_freq=2", "trainer.test_freq=-1",
               "trainer.val_before_train=False", HF, f"trainer.output_dir={out}"]
    jobs.run_job("grpo_tiny", command, tmp_path / "outputs", ray_address=ray_head)
    ckpt = out / "checkpoints"
    straight = jobs.metrics(out)
    manifest = json.loads((ckpt / "global_step_4" / MANIFEST).read_text())
    assert "actor/huggingface/config.json" in manifest["files"] and "trainer_state.json" in manifest["files"]
    shards = sorted(k for k in manifest["files"] if k.startswith("actor/ds/") and "optim_states" in k)
    assert len(shards) == 2, manifest["files"].keys()  # one ZeRO-2 partition per rank, both listed
    shard = ckpt / "global_step_4" / shards[1]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    truncated = shard.stat().st_size
    (ckpt / MARKER).write_text("")

    jobs.run_job("grpo_tiny", command, tmp_path / "outputs", ray_address=ray_head)
    log = (out / "train.log").read_text()
    assert f"checkpoint global_step_4 is damaged: {shards[1]} (size" in log
    assert "(step 2)" in log.split("resuming from global_step_2", 1)[1]  # "resumed from ... (step 2)"
    assert MARKER in log and "kept as global_step_4.damaged" in log and "resuming from global_step_2" in log
    assert "resume_notes" in json.loads((out / "run.json").read_text())
    assert (ckpt / "global_step_4.damaged" / shards[1]).stat().st_size == truncated  # kept as found
    assert sorted(p.name for p in ckpt.iterdir()) == ["global_step_2", "global_step_4", "global_step_4.damaged",
                                                       MARKER]
    assert (ckpt / MARKER).read_text() == "4\n"
    resumed = jobs.metrics(out)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    jobs.assert_same_metrics(straight, resumed)


@pytest.mark.slow  # one real PPO job (shared with test_trainer's PPO run): about 1-2 min on 2 loaded cores
def test_actor_and_critic_keep_limits_both_hold_in_a_ppo_run(ppo_3_step_run):
    # The session's 3-step PPO job, saving every step with max_actor_ckpt_to_keep=1 and
    # max_critic_ckpt_to_keep=2 (jobs.PPO_3_STEPS_KEEP); test_trainer checks the same job's outputs.
    # No validation: what is checked is which checkpoints are kept (validation: test_trainer's GRPO run).
    ppo_3_step_run.start()
    out = ppo_3_step_run.wait()
    ckpt = out / "checkpoints"
    held = {p.name: sorted(c.name for c in p.iterdir() if c.is_dir()) for p in ckpt.iterdir() if p.is_dir()}
    assert held == {"global_step_2": ["critic"], "global_step_3": ["actor", "critic"]}
    assert json.loads((ckpt / "global_step_2" / MANIFEST).read_text())["pruned"] == ["actor"]
    manifest = json.loads((ckpt / "global_step_3" / MANIFEST).read_text())
    for part in ("actor", "critic"):  # both ranks' ZeRO-2 partitions of both roles are sealed
        assert len([k for k in manifest["files"] if k.startswith(f"{part}/ds/") and "optim_states" in k]) == 2
