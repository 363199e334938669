"""Crossed subgroups: two groups of the same ranks, used in opposite orders."""

import torch
import torch.distributed as dist
from _common import DIVERGENT, finish, init

rank = init()
first, second = dist.new_group([0, 1]), dist.new_group([0, 1])
order = (second, first) if DIVERGENT and rank == 1 else (first, second)
dist.all_reduce(torch.ones(4), group=order[0])  # expect: both
dist.all_reduce(torch.ones(4), group=order[1])
finish()
