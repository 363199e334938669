"""Tolerances from an error model, not numbers found by trial on one machine (issue 27).

Two floating-point evaluations of the same math that differ only in summation order (matmul
blocking, thread count, CPU kernels, packed against padded rows, chunked against whole
reductions, bucketed all-reduce) are each within n * u * M of the exact value (first-order
Higham bound: n terms summed, u = eps / 2, M bounding the summands), so they differ by at most
n * eps * M. n is the longest chain of accumulations from the inputs to the compared value; M
its magnitude. A worst-case (linear in n) bound: the typical error grows like sqrt(n), so this
leaves margin on any CPU without hiding bugs, which move values by far more than eps * n * M.

Only torch is imported: the verl parity tests use this from their own environment.
"""

from __future__ import annotations

import torch

FP32_EPS = torch.finfo(torch.float32).eps  # 1.19e-7


def float_tol(terms: int, magnitude: float, dtype: torch.dtype = torch.float32) -> float:
    """Largest difference of two evaluations in ``dtype`` of the same math in different summation orders."""
    return torch.finfo(dtype).eps * terms * max(float(magnitude), 1e-30)


def fp32_tol(terms: int, magnitude: float) -> float:
    """``float_tol`` in fp32, the dtype of the parity tests."""
    return float_tol(terms, magnitude, torch.float32)


def decoder_chain(config, seq_len: int, lora_rank: int = 0) -> int:
    """Accumulations along the longest path from a Qwen3-style decoder's input to a log-prob or
    value (the backward pass walks the same reductions, transposed). ``lora_rank`` adds the
    adapter's two products (x A then (x A) B) to each of the four projection stages of a layer."""
    per_layer = (
        2 * config.hidden_size  # the two RMSNorms
        + config.hidden_size  # q, k, v projections
        + config.head_dim + seq_len  # attention scores, then the weighted sum of values
        + config.num_attention_heads * config.head_dim  # o_proj
        + config.hidden_size + config.intermediate_size  # gate/up, then down
        # qkv, o, gate/up, down: x A sums as many terms as the base product (counted above), then
        # (x A) B sums lora_rank more and adds the base output (2 * lora_rank bounds both)
        + 4 * 2 * lora_rank
    )
    # final norm, head, log-softmax
    return config.num_hidden_layers * per_layer + 2 * config.hidden_size + config.vocab_size


def assert_one_rounding(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, terms: int,
                        magnitude: torch.Tensor | float) -> None:
    """``got`` (computed in fp32, rounded to ``dtype`` once) is within that rounding (``eps / 2``
    relative) of the exact ``ref``, plus the fp32 accumulation of ``terms`` summands of ``magnitude``."""
    bound = torch.finfo(dtype).eps / 2 * ref.abs() + terms * FP32_EPS * magnitude
    excess = (got - ref).abs() - bound
    assert excess.max() <= 0, f"{(got - ref).abs().max():.3e} off, {int((excess > 0).sum())} elements over the bound"
