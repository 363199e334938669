"""Async all_reduce: rank 1 skips the second one; rank 0 blocks in its wait."""

import torch
import torch.distributed as dist
from _common import DIVERGENT, finish, init

rank = init()
dist.all_reduce(torch.ones(4), async_op=True).wait()
if not (DIVERGENT and rank == 1):
    work = dist.all_reduce(torch.ones(4), async_op=True)  # expect: 0
    work.wait()
finish()  # expect: 1
