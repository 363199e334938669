"""Model FLOPs utilisation as verl reports it: ``perf/mfu/actor``, ``perf/mfu/actor_infer``, ``perf/mfu/critic``.

verl 0.9.1 (``utils.flops_counter``; checked against it in ``tests/verl_parity``):

- achieved FLOPs of a batch of sequences (lengths = attention-mask sums): ``6 * N * tokens``
  for the dense weights (forward and backward, N = attention + MLP projections of every layer,
  plus embedding and LM head counted as two vocab x hidden matrices) and ``6 * sum(len^2) *
  head_dim * heads * layers`` for attention scores; the dense decoder formula, which verl uses
  for qwen2/qwen3/llama/mistral and their kin. Other model types (MoE, MLA, ...) get 0 here,
  as verl gives any model type it does not know; verl has formulas for some of them.
- the device's promised peak from a table of dense bf16 peaks matched on the device name (the
  key that sorts last among those the name contains); a CPU counts 448 GFLOP/s, as in verl; an
  unknown accelerator counts infinity, so its MFU is 0.
- MFU = achieved / peak / world size with the whole data-parallel batch's tokens; a
  forward-only pass (log-probs) divides by 3 more.

repro measures each rank over its whole update (every epoch and mini-batch) with its own
sequences, and the driver averages the ranks: the sum of the ranks' FLOPs over the world size,
as verl's numerator; verl times each mini-batch and averages those ratios, the same figure when
the mini-batches take equal time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

# Promised dense bf16 FLOP/s by a fragment of the device name (vendor data sheets; verl's table).
DEVICE_PEAK_FLOPS: dict[str, float] = {
    "CPU": 448e9,
    "GB200": 2.5e15, "B200": 2.25e15,
    "H100": 989e12, "H800": 989e12, "H200": 989e12, "H20": 148e12,
    "A100": 312e12, "A800": 312e12,
    "L40S": 362.05e12, "L40": 181.05e12, "A40": 149.7e12, "L20": 119.5e12,
    "MI300X": 1307e12, "MI350X": 2300e12, "MI355X": 2500e12,
    "910B": 354e12, "A2G3": 354e12, "Ascend950DT": 432e12, "Ascend910": 354e12,
    "RTX 3070 Ti": 21.75e12,
}

# Model types whose FLOPs follow the dense decoder formula (verl's ``_estimate_qwen2_flops`` set).
DENSE_DECODERS = ("qwen2", "qwen3", "llama", "mistral", "minicpmv", "minicpmo", "seed_oss", "glm4v", "mimo")


def device_peak_flops(device_name: str) -> float:
    """Promised FLOP/s of the device named ``device_name`` (``"CPU"`` for a CPU; inf when unknown)."""
    matches = [key for key in DEVICE_PEAK_FLOPS if key in device_name]
    return DEVICE_PEAK_FLOPS[max(matches)] if matches else float("inf")


def device_name(device: torch.device) -> str:
    """The name :func:`device_peak_flops` reads: ``CPU``, or the CUDA device's own name."""
    return "CPU" if device.type == "cpu" else torch.cuda.get_device_name(device)


def achieved_flops(config: Any, seqlens: Sequence[int], seconds: float) -> float:
    """Forward + backward FLOP/s of a model with Hugging Face ``config`` over sequences of ``seqlens``."""
    lengths = [int(n) for n in seqlens]
    return sum(flops_by_part(config, sum(lengths), sum(n * n for n in lengths)).values()) / seconds


def _head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def attention_score_flops(config: Any, sq_tokens: int) -> float:
    """The scores' share of :func:`flops_by_part`'s ``attention`` (``6 S d a L``, ``S = sum(len^2)``): the
    work of the attention kernel itself, counted as verl counts it (the whole square; a causal kernel
    computes about half of it)."""
    return 6 * sq_tokens * _head_dim(config) * config.num_attention_heads * config.num_hidden_layers


def flops_by_part(config: Any, tokens: int, sq_tokens: int) -> dict[str, float]:
    """Forward + backward FLOPs over ``tokens = sum(seqlens)`` with ``sq_tokens = sum(len^2)``, by the
    model part they belong to (verl's dense decoder formula; :func:`achieved_flops` is their sum per
    second). Empty for a model type outside :data:`DENSE_DECODERS`.

    ``attention``: the q, k, v, o projections of every layer and the scores (the ``sum(len^2)`` term);
    ``mlp``: gate, up, down; ``lm_head`` and ``embedding``: one ``vocab x hidden`` matrix each,
    as verl counts them.
    """
    if getattr(config, "model_type", None) not in DENSE_DECODERS:
        return {}
    hidden, layers, heads = config.hidden_size, config.num_hidden_layers, config.num_attention_heads
    head_dim = _head_dim(config)
    kv = config.num_key_value_heads * head_dim
    projections = hidden * (2 * heads * head_dim + 2 * kv) * layers
    return {
        "attention": 6 * projections * tokens + attention_score_flops(config, sq_tokens),
        "mlp": 6 * 3 * hidden * config.intermediate_size * layers * tokens,
        "lm_head": 6 * config.vocab_size * hidden * tokens,
        "embedding": 6 * config.vocab_size * hidden * tokens,
    }


def mfu(config: Any, seqlens: Sequence[int], seconds: float, device: str, world_size: int = 1,
        forward_only: bool = False) -> float:
    """verl's MFU of ``seqlens`` processed in ``seconds`` on ``device`` (a name) by ``world_size`` ranks."""
    if seconds <= 0:
        return 0.0
    value = achieved_flops(config, seqlens, seconds) / device_peak_flops(device) / world_size
    return value / 3 if forward_only else value
