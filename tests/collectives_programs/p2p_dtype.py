"""Point-to-point through batch_isend_irecv: float32 sent, int32 received."""

import torch
import torch.distributed as dist
from _common import DIVERGENT, finish, init

rank = init()
if rank == 0:
    op = dist.P2POp(dist.isend, torch.ones(4), 1)
else:
    op = dist.P2POp(dist.irecv, torch.zeros(4, dtype=torch.int32 if DIVERGENT else torch.float32), 0)
for work in dist.batch_isend_irecv([op]):  # expect: both
    work.wait()
finish()
