"""The torch 2.13 *_single names: all_gather_single sizes differ."""

import torch
import torch.distributed as dist
from _common import DIVERGENT, finish, init

rank = init()
n = 3 if DIVERGENT and rank == 1 else 2
dist.reduce_scatter_single(torch.zeros(2), torch.ones(4))
dist.all_gather_single(torch.zeros(2 * n), torch.ones(n))  # expect: both
finish()
