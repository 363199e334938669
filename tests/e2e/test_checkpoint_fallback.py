"""Checkpoint keep limits through the real trainer (Ray, 2 CPU ranks, DeepSpeed ZeRO-2): what each role keeps.

The damaged-latest-checkpoint fallback through the real trainer (a truncated optimizer shard and an
emptied ``latest`` marker: verified, named, kept as ``.damaged``, resumed from the checkpoint before,
the lost step recomputed equal) ran here on a 4-step job of its own until 2026-11-27; it now runs on the
finished folder of the kill -9 test's resumed run (``tests/e2e/test_run_safety.py``), which
saves at steps 2 and 3 with the Hugging Face export.
"""

from __future__ import annotations

import json

import pytest

from repro.run.checkpoints import MANIFEST


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
