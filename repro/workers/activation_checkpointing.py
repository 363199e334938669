"""Activation checkpointing decided from the memory budget (``model.enable_gradient_checkpointing=auto``).

Checkpointing keeps only each decoder layer's input for the backward and runs the layer's forward a second time
there: at the Qwen3-0.6B shape on one H100 it took the update from 37% to 21% MFU (``results/actor_update/README.md``,
session 16). It pays only where the activations would not fit. ``auto`` decides that once, at the role's first update
(when the reference, the critic and the rollout engine, vLLM's pool included, already hold their memory):

- **per token**: the bytes autograd saves for the backward in one forward of :data:`PROBE_TOKENS` tokens through
  the role's own module on its own device (``torch.autograd.graph.saved_tensors_hooks``; parameters and storages
  already counted left out), so the attention kernel, the dtype and LoRA are the run's own;
- **tokens**: the largest micro-batch the batch plan can give a rank (``ppo_max_token_len_per_gpu`` with dynamic
  batches, else ``ppo_micro_batch_size_per_gpu`` x (``max_prompt_length`` + ``max_response_length``));
- **free**: what the device can still give (CUDA: the driver's free memory plus the allocator's cached free blocks;
  CPU: the host's available memory).

Checkpointing goes on when ``per token x tokens x`` :data:`HEADROOM`, plus one full-size gradient of the trainable
parameters (what the first backward holds before ZeRO reduces it; DeepSpeed allocates its buffers there), exceeds the
free memory. Every rank takes the
same decision: the bytes per token and the tokens are the largest, the free memory the smallest over the ranks (one
all-reduce), because a rank that checkpoints and one that does not run different backward passes, and under ZeRO-3
different collectives.
The linear per-token count holds for attention kernels whose saved state grows with the tokens (FlashAttention, the
varlen path, SDPA's efficient kernels); torch's math attention on CPU also saves its score matrix, which grows with
the square of a row's length, so the probe undercounts long rows there.

Imports torch and psutil only; the engine (:mod:`repro.workers.engine`) calls it, the engine report reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

PROBE_TOKENS = 256
# The backward's own transient tensors (one layer's activation gradients, the LM head's chunk, the allocator's
# rounding) on top of the saved activations: half again, so that "fits" keeps a margin rather than ending in an OOM.
HEADROOM = 1.5


@dataclass(frozen=True)
class Decision:
    """What ``auto`` measured and chose (the engine report's ``checkpointing_auto``)."""

    on: bool
    bytes_per_token: float
    """The largest over the ranks."""
    tokens: int
    """Tokens of the largest micro-batch a rank can get (the largest over the ranks)."""
    free_bytes: int
    """The smallest over the ranks."""
    grad_bytes: int
    """One gradient of the trainable parameters, at their dtype."""

    def line(self) -> str:
        need = self.bytes_per_token * self.tokens * HEADROOM / 2**30
        return (f"activation checkpointing auto: {'on' if self.on else 'off'} (saved activations "
                f"{self.bytes_per_token / 2**10:.1f} KiB/token x {self.tokens} tokens x {HEADROOM} = {need:.2f} GiB, "
                f"gradients {self.grad_bytes / 2**30:.2f} GiB, free {self.free_bytes / 2**30:.2f} GiB)")


def largest_micro_tokens(plan: Any, seq_len: int) -> int:
    """Tokens of the largest micro-batch one rank can get under ``plan`` (a ``RoleBatchPlan``): the dynamic token
    budget (over the SP group, so divided by its size), else the micro-batch's samples at full length."""
    return plan.max_token_len // plan.sp if plan.dynamic else plan.micro * seq_len // plan.sp


def arm(engine: Any, plan: Any, model_cfg: Any, data_cfg: Any) -> None:
    """For ``model_cfg.enable_gradient_checkpointing=auto``: give the role's engine (a ``RoleEngine``) the tokens of a
    rank's largest micro-batch under its ``plan``, so that its first update decides; otherwise nothing."""
    if model_cfg.enable_gradient_checkpointing == "auto":
        engine.auto_checkpointing_tokens = largest_micro_tokens(
            plan, data_cfg.max_prompt_length + data_cfg.max_response_length)


def needs_checkpointing(bytes_per_token: float, tokens: int, grad_bytes: int, free_bytes: int) -> bool:
    """The rule: the largest micro-batch's saved activations, with :data:`HEADROOM`, and a gradient do not fit."""
    return bytes_per_token * tokens * HEADROOM + grad_bytes > free_bytes


def saved_bytes_per_token(forward: Any, tokens: int, module: torch.nn.Module) -> float:
    """Bytes autograd saves for the backward in ``forward()`` (a forward of ``tokens`` tokens), per token.

    Each storage counts once (a view and its base are one); ``module``'s parameters count nothing, read at the moment
    each tensor is saved (ZeRO-3 gathers a layer's weights into new storage just before the layer runs), nor do
    empty tensors (ZeRO-3's released partitions)."""
    seen: set[int] = set()
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if isinstance(t, torch.nn.Parameter) or ptr in seen or storage.nbytes() == 0:
            return t
        seen.add(ptr)
        if ptr not in {p.untyped_storage().data_ptr() for p in module.parameters()}:
            total += storage.nbytes()
        return t

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    del out
    return total / tokens


def free_bytes(device: torch.device) -> int:
    """Memory the device can still give this process."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    import psutil

    return int(psutil.virtual_memory().available)


def decide(forward_tokens: Any, module: torch.nn.Module, device: torch.device, tokens: int) -> Decision:
    """Measure, agree over the ranks and return the decision (the caller turns checkpointing on)."""
    was_training = module.training
    module.train()
    try:
        per_token = saved_bytes_per_token(lambda: forward_tokens(PROBE_TOKENS), PROBE_TOKENS, module)
    finally:
        module.train(was_training)
    free = free_bytes(device)
    if dist.is_initialized():
        agreed = torch.tensor([per_token, float(tokens), -float(free)], dtype=torch.float64,
                              device=device if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        per_token, tokens, free = float(agreed[0]), int(agreed[1]), int(-agreed[2])
    # ZeRO-3 leaves each parameter a partition; ds_numel is its whole size.
    grad = sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in module.parameters() if p.requires_grad)
    return Decision(needs_checkpointing(per_token, tokens, grad, free), per_token, tokens, free, grad)


def enable(module: torch.nn.Module) -> None:
    """Checkpointing on in the Hugging Face model inside ``module`` (a peft model's base too), as ``load_hf_model``
    turns it on for ``enable_gradient_checkpointing=True``."""
    base = module.get_base_model() if hasattr(module, "get_base_model") else module
    base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def in_use(module: torch.nn.Module) -> bool:
    """Whether any layer of ``module`` checkpoints (Hugging Face sets ``gradient_checkpointing`` on each layer)."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in module.modules())
