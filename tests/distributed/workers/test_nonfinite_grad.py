"""A non-finite gradient skips the update and is counted in the metrics: at ZeRO-1/2 through repro's one-reduction
test of the gradients (``repro.workers.overflow_check``, the engine's default), at ZeRO-3 through DeepSpeed's own."""

from __future__ import annotations

import math

from tests.distributed.workers.helpers import (
    ZERO3_PARTITION_ALL,
    make_cfg,
    make_model_dir,
    make_step_batch,
    params_of,
    shard,
)

STAGES = (1, 2, 3)


def _poisoned_updates(rank: int, world: int, model_dir: str) -> list[dict]:
    from repro.workers.actor import ActorWorker

    out = []
    for stage in STAGES:
        cfg = make_cfg(model_dir, world=world, stage=stage, micro=1, mini=4, train_batch_size=8)
        worker = ActorWorker(cfg, ds_overrides=ZERO3_PARTITION_ALL if stage == 3 else None)
        before = params_of(worker)
        batch = make_step_batch(7, 16)
        batch["advantages"][3, 0] = float("inf")  # rank 0, first mini-batch only
        metrics = worker.update_policy(shard(batch, rank, world))
        after = params_of(worker)
        changed = {n for n in before if not bool((before[n] == after[n]).all())}
        finite = all(bool(t.isfinite().all()) for t in after.values())
        out.append({"metrics": metrics, "changed": changed, "names": set(before), "finite": finite,
                    "check": worker.engine.report()["overflow_check"]})
    return out


def test_non_finite_grad_norm_skips_that_update_on_every_stage(pooled, tmp_path):
    model_dir = make_model_dir(tmp_path / "model")
    results = pooled(_poisoned_updates, 2, timeout_s=120, args=(model_dir,))
    for rank_results in results:
        for stage, res in zip(STAGES, rank_results, strict=True):
            m = res["metrics"]
            # Two mini-batches: the poisoned one is skipped on both ranks, the other applies.
            assert m["actor/num_updates"] == 2.0, stage
            assert m["actor/skipped_steps"] == 1.0, (stage, m)
            assert math.isfinite(m["actor/grad_norm"]), (stage, m)
            assert res["finite"], stage  # the poisoned gradient never reached the weights
            assert res["changed"] == res["names"], stage  # the clean mini-batch still trained
            assert res["check"] == ("fused" if stage < 3 else None), (stage, res["check"])
