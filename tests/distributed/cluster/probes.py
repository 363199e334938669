"""The cluster tests' probe worker: what a Ray worker group hosts when the test is about the group
itself (rank environment, process group, errors), not about a role's engine.

Shared by ``test_worker_group.py``, ``test_reuse.py`` and ``test_multinode.py`` (which extend it);
it lives here because test modules never import each other (``tests/unit/test_test_layout.py``).
"""

from __future__ import annotations

import os

import torch


class RankProbe:
    """A minimal hosted worker: joins the process group in its constructor, like the real workers."""

    def __init__(self, tag: str) -> None:
        from repro.cluster.process_group import init_distributed

        init_distributed()
        self.tag = tag

    def env(self) -> dict[str, str]:
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR", "OMP_NUM_THREADS")
        return {k: os.environ.get(k, "") for k in keys} | {"tag": self.tag, "pid": str(os.getpid()),
                                                           "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def fail_on(self, rank: int) -> int:
        if int(os.environ["RANK"]) == rank:
            raise ValueError(f"bad shard on rank {rank}")
        return rank

    def all_reduce(self, value: float) -> float:
        t = torch.tensor([value])
        torch.distributed.all_reduce(t)
        return float(t.item())
