"""Point-to-point: a send of 4 elements against a recv of 8."""

import torch
import torch.distributed as dist
from _common import DIVERGENT, finish, init

rank = init()
if rank == 0:
    dist.send(torch.ones(4), dst=1)  # expect: 0
else:
    dist.recv(torch.zeros(8 if DIVERGENT else 4), src=0)  # expect: 1
finish()
