"""DeepSpeed ZeRO-3: rank 0 alone gathers the partitioned weights in a logging helper (GatheredParameters)."""

import deepspeed
import torch
from _common import DIVERGENT, finish, init


def log_weight_norm(engine):
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):  # expect: 0
        return sum(float(p.norm()) for p in engine.module.parameters())


rank = init()
deepspeed.init_distributed(dist_backend="gloo")
config = {
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "zero_allow_untested_optimizer": True,
}
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
engine, *_ = deepspeed.initialize(model=net, config=config)
for step in range(3):
    loss = engine(torch.ones(2, 16)).sum()  # expect: 1
    engine.backward(loss)
    engine.step()
    if DIVERGENT and rank == 0 and step == 1:
        print("weight norm", log_weight_norm(engine))  # expect: 0
finish()
