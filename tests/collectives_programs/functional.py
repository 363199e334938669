"""Functional collectives: rank 1 all-reduces a longer tensor."""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from _common import DIVERGENT, finish, init

rank = init()
n = 6 if DIVERGENT and rank == 1 else 4
out = funcol.all_reduce(torch.ones(n), "sum", dist.group.WORLD)  # expect: both
print((out * 1).sum().item())
finish()
