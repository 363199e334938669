"""all_to_all_single with uneven splits: rank 1 expects 2 rows from rank 0, which sends 3."""

import torch
import torch.distributed as dist
from _common import DIVERGENT, finish, init

rank = init()
splits_in = [1, 3] if rank == 0 else [2, 2]
splits_out = [1, 2] if rank == 0 else [2 if DIVERGENT else 3, 2]
out = torch.zeros(sum(splits_out), 2)
dist.all_to_all_single(out, torch.ones(sum(splits_in), 2), splits_out, splits_in)  # expect: both
finish()
