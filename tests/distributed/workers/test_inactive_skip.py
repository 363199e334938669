"""The inactive-micro-batch shortcut: refused in data parallel, allowed (and exact) at world size 1."""

from __future__ import annotations

import logging

from tests.distributed.workers.helpers import (
    ADAM_GAIN,
    FP32_EPS,
    PARITY_ADAM_EPS_PER_LR,
    Reference,
    fp32_tol,
    global_mini_batches,
    make_cfg,
    make_model_dir,
    make_step_batch,
    max_abs_diff,
    params_of,
    shard,
    toy_chain,
)

EMPTY_ROWS = (0, 1, 5)


def _guard_on_two_ranks(rank: int, world: int, model_dir: str) -> dict:
    from repro.workers.actor import ActorWorker

    cfg = make_cfg(model_dir, world=world, micro=1)
    cfg.actor_rollout_ref.actor.skip_inactive_micro_batches = True
    out = {}
    try:
        ActorWorker(cfg)
        out["refused"] = None
    except ValueError as err:
        out["refused"] = str(err)
    cfg.actor_rollout_ref.actor.unsafe_allow_skip_in_data_parallel = True
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("repro.workers.actor").addHandler(handler)
    worker = ActorWorker(cfg)
    out["unsafe_enabled"] = worker.skip_inactive
    out["warnings"] = records
    return out


def test_inactive_skip_is_refused_in_data_parallel_unless_unsafe(pooled, tmp_path):
    model_dir = make_model_dir(tmp_path / "model")
    results = pooled(_guard_on_two_ranks, 2, timeout_s=90, args=(model_dir,))
    for res in results:
        assert res["refused"] is not None, "skip_inactive_micro_batches was accepted at world size 2"
        assert "skip_inactive_micro_batches" in res["refused"] and "collectives" in res["refused"]
        assert "unsafe_allow_skip_in_data_parallel" in res["refused"]
        assert res["unsafe_enabled"] is True
        assert any("UNSAFE" in w for w in res["warnings"])


def _one_rank_cfg(model_dir: str, world: int):
    cfg = make_cfg(model_dir, world=world, micro=1, mini=4, train_batch_size=4)
    # eps = lr bounds how far a summation-order difference in a gradient moves a weight (helpers)
    cfg.actor_rollout_ref.actor.optim.eps = PARITY_ADAM_EPS_PER_LR * cfg.actor_rollout_ref.actor.optim.lr
    return cfg


def _skip_on_one_rank(rank: int, world: int, model_dir: str) -> dict:
    from repro.workers.actor import ActorWorker

    cfg = _one_rank_cfg(model_dir, world)
    cfg.actor_rollout_ref.actor.skip_inactive_micro_batches = True
    worker = ActorWorker(cfg)
    init = params_of(worker)
    metrics = worker.update_policy(shard(make_step_batch(3, 8, empty_rows=EMPTY_ROWS), rank, world))
    return {"init": init, "params": params_of(worker), "metrics": metrics,
            "micro_batches_run": worker.engine.micro_batches_run}


def test_inactive_skip_at_world_size_one_skips_and_matches_reference(pooled, tmp_path):
    model_dir = make_model_dir(tmp_path / "model")
    (res,) = pooled(_skip_on_one_rank, 1, timeout_s=90, args=(model_dir,))
    assert res["metrics"]["actor/inactive_micro_batches_skipped"] == len(EMPTY_ROWS)
    # the engine's count of backward passes (the benchmarks' micro-batches an update) leaves the skipped ones out
    assert res["micro_batches_run"] == 8 - len(EMPTY_ROWS)
    ref = Reference(_one_rank_cfg(model_dir, 1), "actor")
    p_tol = 0.0
    for mini in global_mini_batches(make_step_batch(3, 8, empty_rows=EMPTY_ROWS), 1, 8):
        _, norm = ref.update(mini)
        # 8 samples of 12 tokens; |g| <= norm; Adam's bounded gain; the update's own rounding
        p_tol += ADAM_GAIN / PARITY_ADAM_EPS_PER_LR * fp32_tol(toy_chain(12) + 8 * 12, norm) + FP32_EPS
    assert max_abs_diff(res["params"], res["init"]) > 10 * p_tol
    assert max_abs_diff(res["params"], ref.params()) <= p_tol, (max_abs_diff(res["params"], ref.params()), p_tol)
