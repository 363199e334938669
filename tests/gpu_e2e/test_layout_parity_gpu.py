"""Layouts give the same step on 2 GPUs: the layout table of the CPU test, over NCCL (issue 36, item 3).

The rows, the rank functions and the bounds are ``tests/distributed/workers/layout_table.py``'s: ZeRO-1/2/3
at dp=2, Ulysses sp=2, token budgets and remove-padding, each against the same step on one GPU, on step
1's entropy, policy and KL losses and grad norm. The workers run in fp32 here as there (TF32 is off:
PyTorch's default for matmuls, and repro does not turn it on), so the same error model holds: every layout
computes the same math on the same samples and only the summation order moves (cuBLAS's blocking, NCCL's
ring all-reduce and all-to-all, packed against padded rows). What the GPU adds over the CPU test: NCCL's
collectives (the dp all-reduce, ZeRO's reduce-scatter and all-gather, the SP all-to-all), the CUDA
kernels (SDPA and the varlen attention of remove-padding), and DeepSpeed's CUDA accelerator.

``REPRO_GPU_LAYOUTS_ON_GLOO=1`` runs the same on 2 gloo CPU ranks without the GPU gate (a check of the
test's plumbing; it proves nothing about NCCL or CUDA).
"""

from __future__ import annotations

import os

import pytest

from conftest import require_cuda_gpus
from tests.distributed.workers.helpers import make_model_dir
from tests.distributed.workers.layout_table import LAYOUTS, ONE_RANK, check, step_one
from tests.multirank import run_ranks

pytestmark = pytest.mark.gpu

ON_GLOO = os.environ.get("REPRO_GPU_LAYOUTS_ON_GLOO") == "1"
BACKEND = "gloo" if ON_GLOO else "nccl"
RANK_ENV = {"PYTHONUNBUFFERED": "1"}


def _where(rank: int, world: int) -> dict:
    """What the rank runs on, read back (not the backend it was asked for)."""
    import torch
    import torch.distributed as dist

    return {"backend": dist.get_backend(), "cuda": torch.cuda.is_available() and torch.cuda.current_device() == rank,
            "tf32": torch.backends.cuda.matmul.allow_tf32}


def _step_one_where(rank: int, world: int, model_dir: str, layouts: list[dict]) -> tuple[dict, list[dict]]:
    return _where(rank, world), step_one(rank, world, model_dir, layouts)


def test_step_one_is_the_same_in_every_layout_on_two_gpus(tmp_path):
    if not ON_GLOO:
        require_cuda_gpus(2)
    model_dir = make_model_dir(tmp_path / "model")
    kw = {"tmp_path": tmp_path, "env": RANK_ENV, "backend": BACKEND}
    two = run_ranks(_step_one_where, 2, timeout_s=300, args=(model_dir, list(LAYOUTS.values())), **kw)
    one = run_ranks(_step_one_where, 1, timeout_s=120, args=(model_dir, [ONE_RANK]), **kw)
    for where, _ in two + one:
        assert where["backend"] == BACKEND and not where["tf32"], where
        assert ON_GLOO or where["cuda"], where
    lines = check([r for _, r in two], [r for _, r in one], model_dir)
    print(f"\nstep 1 on 2 ranks ({BACKEND}) against one rank (|diff| / bound):\n" + "\n".join(lines))
