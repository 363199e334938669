"""A skipped barrier: rank 1 goes straight to the all_reduce."""

import torch
import torch.distributed as dist
from _common import DIVERGENT, init

rank = init()
if not (DIVERGENT and rank == 1):
    dist.barrier()  # expect: 0
dist.all_reduce(torch.ones(4))  # expect: 1
dist.destroy_process_group()
