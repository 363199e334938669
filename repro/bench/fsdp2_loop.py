"""The FSDP2 loop the worker benchmark compares repro's DeepSpeed workers with (:mod:`repro.bench.workers`).

PyTorch's ``fully_shard`` on every decoder layer and on the root of the same model, as verl's FSDP2 workers
shard it: fp32 parameters (the optimizer's master copy), bf16 compute and fp32 gradient reduction on CUDA,
torch's fused RMSNorm where the DeepSpeed runners get it, the same ``gas`` x (forward with labels, backward),
grad-norm clipping at 1.0 and torch AdamW (fused on CUDA). When gradients are reduced is the one choice:

- once a step (``each_micro=False``): gradient sync on the last micro-batch only (verl's
  ``use_no_sync_for_gradient_accumulation=True``), the unsharded gradients accumulating locally until then;
- after every micro-batch (``each_micro=True``): a reduce-scatter per backward, verl's default
  (``use_no_sync_for_gradient_accumulation=False``) and what DeepSpeed's ZeRO-2 and ZeRO-3 do.

Imports torch and repro's workers (for the model and its norms) inside the function: the benchmark's
parent process imports this module without them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def fsdp2_steps(args: argparse.Namespace, cfg: Any, ids: Any, timed: Callable[[argparse.Namespace, Callable[[], None]],
                list[float]], *, each_micro: bool) -> list[float]:
    """Build the FSDP2 model of ``cfg`` and time ``timed(args, step)`` over ``ids`` (``micro`` x ``gas`` rows)."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from repro.devices import default_device
    from repro.workers import rms_norm
    from repro.workers.engine import load_hf_model
    from repro.workers.zero3_leaf import decoder_layer_classes

    dev = default_device()
    on_cuda = dev.type == "cuda"
    model = load_hf_model(cfg.actor_rollout_ref.model, torch.float32).to(dev)
    if rms_norm.supported(torch.bfloat16 if on_cuda else torch.float32):
        rms_norm.enable(model)  # it computes in bf16 on CUDA (below): the norms the DeepSpeed runners get
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if on_cuda else torch.float32, reduce_dtype=torch.float32)
    # fully_shard's default mesh is CUDA whenever a GPU is visible, DS_ACCELERATOR=cpu or not.
    mesh = init_device_mesh(dev.type, (torch.distributed.get_world_size(),))
    layers = tuple(decoder_layer_classes(model))
    for module in model.modules():
        if isinstance(module, layers):
            fully_shard(module, mp_policy=mp, mesh=mesh)
    fully_shard(model, mp_policy=mp, mesh=mesh)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.actor_rollout_ref.actor.optim.lr, fused=on_cuda)
    ids = ids.to(dev)

    def step() -> None:
        for g in range(args.gas):
            model.set_requires_gradient_sync(each_micro or g == args.gas - 1)
            mb = ids[g * args.micro:(g + 1) * args.micro]
            (model(input_ids=mb, labels=mb, use_cache=False).loss / args.gas).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return timed(args, step)
