"""A rank raises by itself: rank 1 fails on a malformed batch before its first collective."""

import torch
import torch.distributed as dist
from _common import DIVERGENT, finish, init


def load_batch(rank: int, step: int) -> torch.Tensor:
    if DIVERGENT and rank == 1 and step == 1:
        raise ValueError(f"batch {step} on rank {rank} has no rows")  # raises: 1
    return torch.ones(4)


rank = init()
for step in range(3):
    batch = load_batch(rank, step)
    dist.all_reduce(batch)
finish()
