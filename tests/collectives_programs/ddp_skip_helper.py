"""DDP through a helper: rank 1's train_step skips loss.backward() once (a 'skip bad batch' guard)."""

import torch
from _common import DIVERGENT, finish, init


def train_step(model, opt, batch, skip):
    loss = model(batch).sum()
    if not skip:
        loss.backward()  # expect: 0
    opt.step()
    opt.zero_grad()


rank = init()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(6, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    train_step(model, opt, torch.ones(2, 6), skip=DIVERGENT and rank == 1 and step == 1)  # expect: 0
finish()  # expect: 1
