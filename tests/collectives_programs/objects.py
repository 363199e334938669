"""Object collectives: rank 1 skips an all_gather_object."""

import torch.distributed as dist
from _common import DIVERGENT, finish, init

rank = init()
out = [None, None]
if not (DIVERGENT and rank == 1):
    dist.all_gather_object(out, {"rank": rank})  # expect: 0
objs = [{"step": 1}]
dist.broadcast_object_list(objs, src=0)  # expect: 1
finish()
