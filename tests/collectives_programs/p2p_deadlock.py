"""Point-to-point: both ranks receive first (the clean twin orders send/recv by rank)."""

import torch
import torch.distributed as dist
from _common import DIVERGENT, finish, init

rank = init()
peer = 1 - rank
buf = torch.zeros(4)
if DIVERGENT or rank == 1:
    dist.recv(buf, src=peer)  # expect: both
    dist.send(torch.ones(4), dst=peer)
else:
    dist.send(torch.ones(4), dst=peer)
    dist.recv(buf, src=peer)
finish()
