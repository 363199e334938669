"""DeepSpeed ZeRO-3: rank 0 runs one extra training step."""

import deepspeed
import torch
from _common import DIVERGENT, finish, init

rank = init()
deepspeed.init_distributed(dist_backend="gloo")
config = {
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
    "zero_optimization": {"stage": 3},
    "zero_allow_untested_optimizer": True,
}
engine, *_ = deepspeed.initialize(
    model=torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)), config=config
)
for _ in range(3 if DIVERGENT and rank == 0 else 2):
    loss = engine(torch.ones(2, 8)).sum()
    engine.backward(loss)  # expect: 0 (the gradient reduce_scatter; small ZeRO-3 params stay resident)
    engine.step()
finish()  # expect: 1
