"""DDP: rank 1 skips one backward (the reducer's all_reduce runs in C++)."""

import torch
from _common import DIVERGENT, finish, init

rank = init()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.ones(2, 4)).sum()
    if not (DIVERGENT and rank == 1 and step == 1):
        loss.backward()  # expect: both
    opt.step()
    opt.zero_grad()
finish()
