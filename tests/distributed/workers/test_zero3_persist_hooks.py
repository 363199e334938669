"""ZeRO-3's module hooks taken off the modules whose parameters all stay whole (``repro.workers.zero3_persist_hooks``,
the engine's default) on 2 gloo ranks, against DeepSpeed's hooks on every module: the forward bitwise (the
actor's and the frozen reference's log-probs, after something outside the step released the whole parameters), the
gradients within the error model of another summation order, and the hooked modules, counted from the hooks'
handles, those holding a sharded parameter, worked out here from the parameters' sizes."""

from __future__ import annotations

from tests.distributed.workers.helpers import (
    full_grads,
    grad_tol,
    make_cfg,
    make_model_dir,
    make_step_batch,
    shard,
)

SAMPLES = 8  # train_batch_size 4 x n 2
SEQ = 12  # make_step_batch: prompt 6 + response 6
# The toy model's norms and attention projections (512-1,024 elements) stay whole, its MLP and embedding (2,048)
# are sharded; without leaf modules each linear and norm is a module of its own, so some lose their hooks and
# the others still fetch their shards, in the same forward.
PERSIST = 1024


def _run(rank: int, world: int, model_dir: str) -> list[dict]:
    import deepspeed
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    from repro.workers.actor import ActorWorker

    out = []
    batch = shard(make_step_batch(50, SAMPLES), rank, world)
    for unhooked in (True, False):
        cfg = make_cfg(model_dir, world=world, stage=3, micro=1)
        for section in (cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.ref):
            section.deepspeed.stage3_param_persistence_threshold = PERSIST
            section.deepspeed.zero3_leaf_modules = False
            section.deepspeed.zero3_unhook_persistent_modules = unhooked
        worker = ActorWorker(cfg)
        module = worker.engine.module
        # A gather of every parameter (as a checkpoint's export does) partitions the whole ones too on its exit:
        # the next forward must gather them back, with or without their modules' hooks.
        with deepspeed.zero.GatheredParameters(list(module.parameters())):
            pass
        released = sum(1 for p in module.parameters() if p.ds_persist and p.ds_status == ZeroParamStatus.NOT_AVAILABLE)
        log_probs = worker.compute_log_prob(batch)["log_probs"]
        grads: list[dict] = []
        worker.engine.before_step = lambda engine, grads=grads: grads.append(full_grads(engine))
        worker.update_policy(shard(make_step_batch(40, SAMPLES), rank, world))
        cfg.actor_rollout_ref.ref.deepspeed.zero_stage = 3
        ref = ActorWorker(cfg, role="ref")
        out.append({"report": worker.engine.report(), "released": released, "log_probs": log_probs,
                    "grads": grads[0], "ref_log_probs": ref.compute_log_prob(batch)["log_probs"],
                    "ref_report": ref.engine.report(), "modules": sum(1 for _ in module.modules()),
                    "sharded_modules": sum(1 for m in module.modules()
                                           if any(p.ds_numel > PERSIST for p in m.parameters(recurse=False)))})
    return out


def test_unhooked_whole_modules_run_the_same_forward_and_gradients_as_deepspeeds_hooks(pooled, tmp_path):
    model_dir = make_model_dir(tmp_path / "model")
    ranks = pooled(_run, 2, timeout_s=180, args=(model_dir,))
    for unhooked, hooked in ranks:
        assert unhooked["report"]["zero3_persistent_params"] > 0
        # Hooked: every module (DeepSpeed registers each when no leaf stops it). Unhooked: the root and the modules
        # holding a sharded parameter (the embedding, the MLP's linears), nothing else; the reference the same.
        assert 0 < unhooked["sharded_modules"] < unhooked["modules"] - 1
        assert unhooked["report"]["zero3_hooked_modules"] == 1 + unhooked["sharded_modules"]
        assert unhooked["ref_report"]["zero3_hooked_modules"] == 1 + unhooked["sharded_modules"]
        assert hooked["report"]["zero3_hooked_modules"] == hooked["ref_report"]["zero3_hooked_modules"] == \
            hooked["modules"]
        # The forward after the whole parameters were released: bitwise (the hooks fetch, they compute nothing).
        assert unhooked["released"] == unhooked["report"]["zero3_persistent_params"]
        assert unhooked["log_probs"].equal(hooked["log_probs"])
        assert unhooked["ref_log_probs"].equal(hooked["ref_log_probs"])
        # The first step's gradients: the hooks' autograd nodes change the order in which autograd sums a tensor's
        # gradient from its consumers (the residual stream's), so the same terms in another order: the error model
        # of a mini-batch's tokens (this rank's share of 2 of the 4 samples an optimizer step takes, every rank).
        tol = grad_tol(SEQ, SAMPLES // 2 * SEQ, hooked["grads"])
        assert unhooked["grads"].keys() == hooked["grads"].keys()
        worst = max((unhooked["grads"][n] - g).abs().max().item() for n, g in hooked["grads"].items())
        assert worst <= tol, (worst, tol)
