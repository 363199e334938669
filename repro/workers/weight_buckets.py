"""Group a stream of ``(name, tensor)`` weights into buckets under a byte budget.

The rollout sync consumes the actor's ``iter_full_weights`` through this: at ZeRO-3 each
tensor is a freshly gathered full copy, so streaming in buckets bounds how many of those copies
are alive at once, and the engine's ``load_weights`` runs once per bucket instead of once per
tensor. A tensor larger than the budget travels alone; order is kept and nothing is dropped or
repeated.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

Named = tuple[str, torch.Tensor]


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def buckets(named: Iterable[Named], budget_bytes: int) -> Iterator[list[Named]]:
    """Consecutive runs of ``named`` whose sizes sum to at most ``budget_bytes`` (one oversized tensor alone)."""
    if budget_bytes <= 0:
        raise ValueError(f"weight bucket budget must be > 0 bytes, got {budget_bytes}")
    bucket: list[Named] = []
    size = 0
    for name, tensor in named:
        n = nbytes(tensor)
        if bucket and size + n > budget_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += n
    if bucket:
        yield bucket
