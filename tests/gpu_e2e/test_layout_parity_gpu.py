"""Layouts give the same step on GPUs: the layout table of the CPU test, over NCCL (issue 36, item 3), on 2
GPUs, and the seed's dp=2 x sp=2 rows on 4 (issue 38; skipped with fewer).

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
from tests.distributed.workers.layout_table import LAYOUTS, LAYOUTS_DP2_SP2, ONE_RANK, check, step_one
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


def _table_on(world: int, layouts: dict, tmp_path) -> list[str]:
    if not ON_GLOO:
        require_cuda_gpus(world)
    model_dir = make_model_dir(tmp_path / "model")
    kw = {"tmp_path": tmp_path, "env": RANK_ENV, "backend": BACKEND}
    many = run_ranks(_step_one_where, world, timeout_s=300, args=(model_dir, list(layouts.values())), **kw)
    one = run_ranks(_step_one_where, 1, timeout_s=120, args=(model_dir, [ONE_RANK]), **kw)
    for where, _ in many + one:
        assert where["backend"] == BACKEND and not where["tf32"], where
        assert ON_GLOO or where["cuda"], where
    return check([r for _, r in many], [r for _, r in one], model_dir, layouts)


def test_step_one_is_the_same_in_every_layout_on_two_gpus(tmp_path):
    lines = _table_on(2, LAYOUTS, tmp_path)
    print(f"\nstep 1 on 2 ranks ({BACKEND}) against one rank (|diff| / bound):\n" + "\n".join(lines))


def test_step_one_at_dp2_x_sp2_on_four_gpus_is_the_same_as_on_one(tmp_path):
    """The seed's 4-GPU layout (issue 38): dp=2 x sp=2, SP groups {0, 1} and {2, 3}."""
    lines = _table_on(4, LAYOUTS_DP2_SP2, tmp_path)
    print(f"\nstep 1 on 4 ranks ({BACKEND}) against one rank (|diff| / bound):\n" + "\n".join(lines))
