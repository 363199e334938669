"""Point-to-point, any source: rank 0 collects results with recv(src=None); rank 1 sends one too many."""

import torch
import torch.distributed as dist
from _common import DIVERGENT, finish, init

RESULTS = 2
rank = init()
if rank == 0:
    totals = {}
    for _ in range(RESULTS):
        result = torch.zeros(4)
        sender = dist.recv(result)  # from whichever worker finished first
        totals[sender] = totals.get(sender, 0.0) + result.sum().item()
else:
    for step in range(RESULTS + 1 if DIVERGENT else RESULTS):
        dist.send(torch.full((4,), float(step)), dst=0)  # expect: 1
finish()  # expect: 0
