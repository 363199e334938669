"""Shared start-up of the twin programs: ``python PROGRAM.py clean|divergent`` under the trace launcher."""

import sys

import torch.distributed as dist

DIVERGENT = len(sys.argv) > 1 and sys.argv[1] == "divergent"


def init() -> int:
    dist.init_process_group("gloo")
    return dist.get_rank()


def finish() -> None:
    dist.barrier()
    dist.destroy_process_group()
