"""FSDP2 (fully_shard): rank 0 runs one extra step."""

import torch
from _common import DIVERGENT, finish, init
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

rank = init()
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
steps = 3 if DIVERGENT and rank == 0 else 2
for _ in range(steps):
    loss = model(torch.ones(2, 8)).sum()  # expect: 0
    loss.backward()
    opt.step()
    opt.zero_grad()
finish()  # expect: 1
