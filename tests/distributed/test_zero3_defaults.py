"""The size-aware ZeRO-3 sizes train exactly as DeepSpeed's constants do (2 gloo ranks, fp32).

On the toy Qwen3 (h = 32) DeepSpeed's persistence threshold (1e5) keeps every parameter whole on
every rank, while the size-aware one (10 * h = 320) partitions every weight matrix, and the
size-aware reduce bucket (h * h = 1024 elements) is smaller than the MLP and embedding gradients,
which DeepSpeed then reduces one by one. Both engines are read back to show they really differ;
the actor's updates must still agree, with and without CPU optimizer and parameter offload.
"""

from __future__ import annotations

from tests.distributed.workers.helpers import make_cfg, make_model_dir, max_abs_diff, params_of, train_steps

SAMPLES = 8  # train_batch_size 4 x n 2
# Exact: with 2 ranks every reduced value is one fp32 sum a + b, whatever bucket carries it.
TOL = 0.0


def _train(rank: int, world: int, model_dir: str) -> list[dict]:
    from repro.workers.actor import ActorWorker

    out = []
    for offload, param_offload in (("none", False), ("cpu", True)):
        for size_aware in (False, True):
            cfg = make_cfg(model_dir, world=world, stage=3, offload=offload, param_offload=param_offload, micro=1,
                           use_kl_loss=True, entropy_coeff=0.01)
            cfg.actor_rollout_ref.actor.deepspeed.zero3_size_aware = size_aware
            worker = ActorWorker(cfg)
            engine = worker.engine.engine
            zero3 = engine.optimizer  # DeepSpeedZeroOptimizer_Stage3: the sizes it really uses
            params = list(engine.module.parameters())
            init = params_of(worker)
            metrics = train_steps(worker, "actor", rank, world, range(2), SAMPLES)
            out.append({
                "offload": offload, "size_aware": size_aware, "init": init, "final": params_of(worker),
                "metrics": metrics,
                # Read from the engine: the sizes DeepSpeed took, and which parameters it left unpartitioned.
                "reduce_bucket_size": zero3.reduce_bucket_size,
                "prefetch": zero3.prefetch_elements,
                "persistent": sum(bool(getattr(p, "ds_persist", False)) for p in params),
                "n_params": len(params),
                "engaged": worker.engine.report(),
            })
    return out


def test_size_aware_zero3_update_equals_deepspeed_defaults(pooled, tmp_path):
    model_dir = make_model_dir(tmp_path / "model")
    results = pooled(_train, 2, timeout_s=150, args=(model_dir,))
    runs = results[0]
    for old, new in zip(runs[0::2], runs[1::2], strict=True):
        assert (old["size_aware"], new["size_aware"]) == (False, True)
        # The offload case really offloads (read back from the engine, not the config asked).
        placed = ("cpu_offload", "cpu_offload") if new["offload"] == "cpu" else ("device", "device")
        for run in (old, new):
            assert (run["engaged"]["optimizer"], run["engaged"]["param"]) == placed, run["engaged"]
        assert (old["reduce_bucket_size"], old["prefetch"]) == (500_000_000, 50_000_000)
        assert (new["reduce_bucket_size"], new["prefetch"]) == (32 * 32, int(0.9 * 32 * 32))
        # DeepSpeed's threshold leaves the toy model whole; 10 * h partitions its matrices.
        assert old["persistent"] == old["n_params"] and new["persistent"] < new["n_params"] / 2, (old, new)
        assert max_abs_diff(old["init"], new["init"]) == 0.0
        moved = max_abs_diff(new["final"], new["init"])
        assert moved > 1e-3, f"{new['offload']}: the update did not move the weights ({moved})"
        diff = max_abs_diff(old["final"], new["final"])
        assert diff <= TOL, f"offload={new['offload']}: max |size-aware - DeepSpeed's| = {diff:.3g}"
        for a, b in zip(old["metrics"], new["metrics"], strict=True):
            assert abs(a["actor/grad_norm"] - b["actor/grad_norm"]) <= TOL
    # Every rank ends with the same full weights.
    for mine, theirs in zip(results[0], results[1], strict=True):
        assert max_abs_diff(mine["final"], theirs["final"]) == 0.0
