"""DDP: rank 1 alone builds its DistributedDataParallel with find_unused_parameters=True.

Both ranks run the same lines; only the reducers differ: rank 1's all-reduces the unused-parameter
bitmap after its gradient buckets, which rank 0's never issues. Without the trace this hangs.
"""

import torch
from _common import DIVERGENT, finish, init

rank = init()
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
model = torch.nn.parallel.DistributedDataParallel(net, find_unused_parameters=DIVERGENT and rank == 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _step in range(3):
    loss = model(torch.ones(2, 4)).sum()
    loss.backward()  # expect: 1
    opt.step()
    opt.zero_grad()
finish()
