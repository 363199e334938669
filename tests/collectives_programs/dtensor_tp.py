"""DTensor / tensor parallel: a column-parallel Linear; rank 1 feeds a longer batch."""

import torch
from _common import DIVERGENT, finish, init
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

rank = init()
torch.manual_seed(0)
mesh = init_device_mesh("cpu", (2,))
model = parallelize_module(torch.nn.Linear(8, 8), mesh, ColwiseParallel(use_local_output=False))
rows = 3 if DIVERGENT and rank == 1 else 2
from torch.distributed.tensor import Replicate  # noqa: E402

out = model(torch.ones(rows, 8))
full = out.redistribute(mesh, [Replicate()]).to_local()  # expect: both
print(full.sum().item())
finish()
