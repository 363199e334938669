"""No device wait inside a worker's micro-batch loop that repro or its DeepSpeed JSON puts there (issue 35: on one
H100 the update at four micro-batches waited for the device before each one, ``results/actor_update/README.md``,
session 34). DeepSpeed's throughput timer, which synchronizes the accelerator around every forward from its third
step on, is off and reads back off; and the packed forward reads only the masks' host copies, never the device's
masks. On these CPU ranks a synchronize costs nothing, so the test counts the accelerator's calls, and it makes the
device's masks meta tensors, which cannot be copied anywhere."""

from __future__ import annotations

from tests.distributed.workers.helpers import make_cfg, make_model_dir, make_step_batch, shard


def _waits(rank: int, world: int, model_dir: str) -> dict:
    import torch
    from deepspeed.accelerator import get_accelerator

    from repro.batching.batch import select
    from repro.workers import ulysses
    from repro.workers.actor import ActorWorker

    accelerator, calls = get_accelerator(), []
    real = accelerator.synchronize

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    # counted where DeepSpeed looks it up (the one accelerator object), and still synchronizing
    accelerator.synchronize = counted
    try:
        cfg = make_cfg(model_dir, world=world, stage=2, micro=1, mini=4, train_batch_size=8)
        cfg.actor_rollout_ref.model.use_remove_padding = True
        worker = ActorWorker(cfg)
        batch = shard(make_step_batch(7, 16), rank, world)
        for _ in range(2):  # the timer synchronizes from DeepSpeed's third step on: two steps an update
            worker.update_policy(batch)
        out = {"report": worker.engine.report()["throughput_timer_syncs"]}
        calls.clear()
        worker.update_policy(batch)
        out["off"] = len(calls)
        # the control, DeepSpeed's default: with the timer on (its own step count past two again), the same update
        # synchronizes around every forward
        worker.engine.engine.tput_timer.config.enabled = True
        for _ in range(2):
            worker.update_policy(batch)
        calls.clear()
        worker.update_policy(batch)
        out["on"] = len(calls)
    finally:  # a pooled rank runs other tests next
        accelerator.synchronize = real
    # the packed forward with the device's masks unreadable: only their host copies may be read
    mb = select(ulysses.rank_batch(batch, 1, worker.engine.device), [0, 1, 2])
    with torch.no_grad():
        expected, _ = worker._log_probs(mb, with_entropy=False)
        blind = {**mb, **{k: torch.empty_like(mb[k], device="meta") for k in ("attention_mask", "response_mask")}}
        got, _ = worker._log_probs(blind, with_entropy=False)
    out["same"] = bool(torch.equal(expected, got))
    return out


def test_an_update_issues_no_device_wait_of_deepspeeds_timer_and_packs_from_host_copies(pooled, tmp_path):
    model_dir = make_model_dir(tmp_path / "model")
    for res in pooled(_waits, 2, timeout_s=120, args=(model_dir,)):
        assert res["report"] is False
        # 8 samples a rank in micro-batches of 1 over two steps: 8 forwards, each one synchronized with the timer on
        assert res["off"] == 0 and res["on"] >= 8, res
        assert res["same"]  # the same log-probs, bitwise: the index math is the same, read from the host
