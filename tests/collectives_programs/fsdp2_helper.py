"""FSDP2 through a helper: rank 0's loop also runs a 'gradient probe' (one extra forward/backward) at step 1."""

import torch
from _common import DIVERGENT, finish, init
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def train_step(model, opt, batch):
    loss = model(batch).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()


def gradient_probe(model, batch):
    model(batch).sum().backward()  # expect: 0
    model.zero_grad()


rank = init()
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
for layer in (model[0], model[2]):
    fully_shard(layer, mesh=init_device_mesh("cpu", (2,)))
fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    train_step(model, opt, torch.ones(4, 8))
    if DIVERGENT and rank == 0 and step == 1:
        gradient_probe(model, torch.ones(4, 8))  # expect: 0
finish()  # expect: 1
