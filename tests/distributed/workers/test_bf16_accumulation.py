"""bf16 training: fp32 gradient accumulation (DeepSpeed ``data_types.grad_accum_dtype``) is closer
to the fp32 reference gradient than accumulating in bf16.

Two gloo ranks, 16 micro-batches of one sample per rank; the accumulated gradient is read just
before the optimizer step and compared (relative L2 error) with the fp32 gradient of the whole
mini-batch computed from the same bf16-rounded weights.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed.workers.helpers import (
    Reference,
    global_mini_batches,
    make_cfg,
    make_model_dir,
    make_step_batch,
    shard,
)

SAMPLES = 32  # 16 per rank, one micro-batch each


def _cfg(model_dir: str, stage: int, fp32_accum: bool, dtype: str = "bfloat16"):
    return make_cfg(model_dir, world=2, stage=stage, micro=1, n=2, mini=16, train_batch_size=16,
                    model_dtype=dtype, fp32_grad_accum=fp32_accum, grad_clip=0.0)


def _grads(rank: int, world: int, model_dir: str, stage: int) -> dict:
    from deepspeed.utils import safe_get_full_grad

    from repro.workers.actor import ActorWorker

    out = {}
    for fp32_accum in (False, True):
        worker = ActorWorker(_cfg(model_dir, stage, fp32_accum))
        assert ("data_types" in worker.engine.ds_config) == fp32_accum
        init = {n: t.float().cpu().clone() for n, t in worker.iter_full_weights()}
        grads: dict[str, torch.Tensor] = {}

        def probe(engine, grads=grads) -> None:
            for name, p in engine.module.named_parameters():
                grads[name] = safe_get_full_grad(p).detach().float().cpu().clone()

        worker.engine.before_step = probe
        worker.update_policy(shard(make_step_batch(11, SAMPLES), rank, world))
        out[fp32_accum] = {"init": init, "grads": grads}
    return out


def _rel_error(grads: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    diff = torch.sqrt(sum(((grads[k] - ref[k]) ** 2).sum() for k in ref))
    return float(diff / torch.sqrt(sum((ref[k] ** 2).sum() for k in ref)))


@pytest.mark.parametrize("stage", [1, 2])
def test_fp32_accumulation_is_closer_to_fp32_reference_than_bf16(stage, pooled, tmp_path):
    model_dir = make_model_dir(tmp_path / "model")
    results = pooled(_grads, 2, timeout_s=120, args=(model_dir, stage))
    errors = {}
    for fp32_accum in (False, True):
        res = results[0][fp32_accum]
        ref = Reference(_cfg(model_dir, stage, fp32_accum, dtype="float32"), "actor")
        ref.set_weights(res["init"])  # the bf16-rounded start, in fp32
        (mini,) = global_mini_batches(make_step_batch(11, SAMPLES), 2, 16)
        errors[fp32_accum] = _rel_error(res["grads"], ref.grads(mini))
    print(f"ZeRO-{stage} bf16 grad relative L2 error vs fp32: bf16 accumulation {errors[False]:.3e}, "
          f"fp32 accumulation {errors[True]:.3e}")
    assert errors[True] < errors[False]
