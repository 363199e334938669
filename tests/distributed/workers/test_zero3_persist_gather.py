"""ZeRO-3's whole parameters gathered after each optimizer step in one coalesced all-gather
(``repro.workers.zero3_persist_gather``, the engine's default) on 2 gloo ranks: the same bits as DeepSpeed's own
gather, one all-gather per parameter, and that many collectives fewer, read from the collective trace; a frozen ZeRO-3
role (the reference, no optimizer step) reports none. The rollout's weight sync reads the full weights and leaves the
whole ones whole (and gathers back those something else released): the same bits as DeepSpeed's gather of every
parameter, and the next forward gathers nothing more than a forward before the sync."""

from __future__ import annotations

from repro.collectives.analyze.findings import load_traces
from tests.distributed.workers.helpers import make_cfg, make_model_dir, make_step_batch, params_of, shard

SAMPLES = 8  # train_batch_size 4 x n 2
# The toy model's norms and attention projections (512-1,024 elements) stay whole, its MLP and embedding (2,048)
# are sharded: the step updates both kinds.
PERSIST = 1024


def _train(rank: int, world: int, model_dir: str, trace_root: str) -> list[dict]:
    from repro.collectives_trace import trace_collectives
    from repro.workers.actor import ActorWorker

    out = []
    for coalesced in (True, False):
        cfg = make_cfg(model_dir, world=world, stage=3, micro=1)
        cfg.actor_rollout_ref.actor.deepspeed.stage3_param_persistence_threshold = PERSIST
        cfg.actor_rollout_ref.actor.deepspeed.zero3_coalesce_persistent_gather = coalesced
        worker = ActorWorker(cfg)
        with trace_collectives(f"{trace_root}/{coalesced}", check="off"):
            for step in range(2):
                worker.update_policy(shard(make_step_batch(40 + step, SAMPLES), rank, world))
        out.append({"report": worker.engine.report(), "params": params_of(worker),
                    "steps": worker.engine.engine.global_steps})
    # A frozen ZeRO-3 role (the reference): DeepSpeed's engine holds no optimizer step to gather after.
    cfg.actor_rollout_ref.ref.deepspeed.zero_stage = 3
    out.append({"report": ActorWorker(cfg, role="ref").engine.report()})
    return out


def _all_gathers(trace_dir) -> int:
    calls = load_traces(trace_dir)[0].calls
    return sum(1 for c in calls if c.op.startswith("all_gather") or c.op == "_all_gather_base")


def test_the_coalesced_gather_trains_bitwise_as_deepspeeds_with_one_all_gather_a_step(multirank, tmp_path):
    model_dir = make_model_dir(tmp_path / "model")
    ranks = multirank(_train, timeout_s=180, args=(model_dir, str(tmp_path / "trace")))
    (coalesced, stock, reference) = ranks[0]
    for rank in ranks:
        assert [r["report"]["zero3_persistent_gather"] for r in rank] == ["coalesced", "per_parameter", None]
    assert reference["report"]["stage"] == 3 and reference["report"]["zero3_persistent_params"] > 0
    persistent = coalesced["report"]["zero3_persistent_params"]
    assert 0 < persistent == stock["report"]["zero3_persistent_params"]
    steps = coalesced["steps"]
    assert steps >= 2 and steps == stock["steps"]
    # Bitwise: an all-gather moves bytes, whichever call moves them.
    for name, tensor in stock["params"].items():
        assert coalesced["params"][name].equal(tensor), name
    assert ranks[1][0]["params"].keys() == coalesced["params"].keys()
    # DeepSpeed gathers each whole parameter in a call of its own after every step; the coalesced gather makes one
    # call a step for all of them (one dtype). Every other all-gather (the sharded weights' fetches) is the same.
    per_parameter, one_call = _all_gathers(tmp_path / "trace" / "False"), _all_gathers(tmp_path / "trace" / "True")
    assert per_parameter - one_call == (persistent - 1) * steps, (per_parameter, one_call, persistent, steps)


def _sync_then_forward(rank: int, world: int, model_dir: str, trace_root: str) -> dict:
    import deepspeed
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    from repro.collectives_trace import trace_collectives
    from repro.workers.actor import ActorWorker

    cfg = make_cfg(model_dir, world=world, stage=3, micro=1)
    cfg.actor_rollout_ref.actor.deepspeed.stage3_param_persistence_threshold = PERSIST
    worker = ActorWorker(cfg)
    module = worker.engine.module
    worker.update_policy(shard(make_step_batch(40, SAMPLES), rank, world))
    batch = shard(make_step_batch(50, SAMPLES), rank, world)
    with trace_collectives(f"{trace_root}/before", check="off"):
        before = worker.compute_log_prob(batch)["log_probs"]
    # the rollout's weight sync (repro.workers.rollout_hf / rollout_vllm): every full weight, one at a time
    exported = {name: tensor.clone() for name, tensor in worker.iter_full_weights()}
    whole = sum(1 for p in module.parameters() if p.ds_persist and p.ds_status == ZeroParamStatus.AVAILABLE)
    with trace_collectives(f"{trace_root}/after", check="off"):
        after = worker.compute_log_prob(batch)["log_probs"]
    # The reference: DeepSpeed's own gather of every parameter at once, which on its exit partitions the whole ones.
    with deepspeed.zero.GatheredParameters(list(module.parameters())):
        reference = {name: p.data.detach().clone() for name, p in module.named_parameters()}
    released = sum(1 for p in module.parameters() if p.ds_persist and p.ds_status == ZeroParamStatus.NOT_AVAILABLE)
    # A sync after such a release gathers them back, and keeps them whole.
    again = {name: tensor.clone() for name, tensor in worker.iter_full_weights()}
    whole_again = sum(1 for p in module.parameters() if p.ds_persist and p.ds_status == ZeroParamStatus.AVAILABLE)
    return {"exported": exported, "reference": reference, "whole": whole, "before": before, "after": after,
            "persistent": worker.engine.report()["zero3_persistent_params"], "released": released,
            "again": again, "whole_again": whole_again}


def _gathered_elements(trace_dir) -> tuple[int, int]:
    calls = [c for c in load_traces(trace_dir)[0].calls if c.op.startswith("all_gather") or c.op == "_all_gather_base"]
    return len(calls), sum(c.numel for c in calls)


def test_the_weight_sync_leaves_the_whole_parameters_whole_so_the_next_forward_gathers_no_more(multirank, tmp_path):
    model_dir = make_model_dir(tmp_path / "model")
    ranks = multirank(_sync_then_forward, timeout_s=180, args=(model_dir, str(tmp_path / "trace")))
    for out in ranks:
        assert out["exported"].keys() == out["reference"].keys()
        # Bitwise: a whole parameter is read where it lies, a sharded one gathered; either way the same bytes.
        for name, tensor in out["reference"].items():
            assert out["exported"][name].equal(tensor), name
        assert 0 < out["whole"] == out["persistent"]
        assert out["released"] == out["persistent"] == out["whole_again"]
        for name, tensor in out["reference"].items():
            assert out["again"][name].equal(tensor), name
        # The same weights, the same arithmetic: bitwise.
        assert out["after"].equal(out["before"])
    # DeepSpeed's GatheredParameters partitions whole parameters on exit: before the mend the sync left them all
    # sharded, and the next forward gathered them back (one more coalesced all-gather of all their elements).
    assert _gathered_elements(tmp_path / "trace" / "after") == _gathered_elements(tmp_path / "trace" / "before")
