"""Optimizer and parameter placement, and ``overlap_comm``, read back from real DeepSpeed engines on 2 gloo ranks.

ZeRO-1 + ``offload=cpu`` offloads the optimizer here (verl's seed turned it into no offload):
DeepSpeed's stage-1/2 optimizer switches its offload on and keeps the fp32 master partitions on
the CPU, exactly as at ZeRO-2. The exactness of ZeRO-1 with offload against the single-process
reference is covered by ``test_zero_parity.py`` (its ``offload=cpu`` cases).
"""

from __future__ import annotations

import pytest

from tests.distributed.workers.helpers import make_cfg, make_model_dir, make_step_batch, shard

CASES = [  # (stage, offload, param_offload) -> (optimizer placement, parameter placement)
    ((1, "none", False), ("device", "device")),
    ((1, "cpu", False), ("cpu_offload", "device")),
    ((2, "none", False), ("device", "device")),
    ((2, "cpu", False), ("cpu_offload", "device")),
    ((3, "none", False), ("device", "device")),
    ((3, "cpu", True), ("cpu_offload", "cpu_offload")),
]

# overlap_comm set on one case; the others keep DeepSpeed's default (on at ZeRO-3 only), read back from the engine.
OVERLAP = {(2, "none"): True}


def _placements(rank: int, world: int, model_dir: str) -> list[tuple[str, str, dict]]:
    from repro.workers.actor import ActorWorker
    from repro.workers.placement import optimizer_placement, param_placement, placement_metrics

    out = []
    for (stage, offload, param_offload), _ in CASES:
        cfg = make_cfg(model_dir, world=world, stage=stage, offload=offload, param_offload=param_offload, micro=1)
        cfg.actor_rollout_ref.actor.deepspeed.overlap_comm = OVERLAP.get((stage, offload))
        worker = ActorWorker(cfg)
        worker.update_policy(shard(make_step_batch(100, 8), rank, world))
        engine = worker.engine.engine
        out.append((optimizer_placement(engine), param_placement(engine), placement_metrics(engine),
                    worker.engine.report()["overlap_comm"]))
    return out


@pytest.mark.distributed
def test_engine_placement_per_zero_case_and_zero1_offloads(pooled, tmp_path):
    model_dir = make_model_dir(tmp_path / "model")
    results = pooled(_placements, 2, args=(model_dir,), timeout_s=120)
    for rank_result in results:
        for (case, want), (opt, param, metrics, overlap) in zip(CASES, rank_result, strict=True):
            assert (opt, param) == want, case
            assert overlap == OVERLAP.get(case[:2], case[0] == 3), case
            assert metrics == {"ds/optimizer_offloaded": float(want[0] == "cpu_offload"),
                               "ds/params_offloaded": float(want[1] == "cpu_offload")}
