"""Process-group start-up shared by workers, tests and tools.

DeepSpeed on CPU (``DS_ACCELERATOR=cpu``) JIT-builds a shared-memory allreduce op the first
time a backend is created (25-85 s on 2 cores). Gloo is all the CPU paths here need, so the op
is marked incompatible before DeepSpeed looks for it; ``REPRO_DS_SHM_OP=1`` keeps it.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from repro.devices import on_cpu


def disable_deepspeed_shm_op() -> None:
    """Keep DeepSpeed from JIT-compiling its CPU shared-memory comm op (gloo is used instead)."""
    if os.environ.get("REPRO_DS_SHM_OP") == "1":
        return
    import deepspeed.ops

    # DeepSpeed caches this probe in the module; its own comment says edits to it persist.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def init_distributed(timeout_s: float = 600.0) -> None:
    """Initialise torch.distributed and deepspeed.comm from the usual env vars.

    Uses gloo on CPU and NCCL on CUDA. Safe to call twice. A process group that already exists
    (created by a test harness, say) is reused as it is. With ``REPRO_COLLECTIVES_TRACE=<dir>``
    set, collective tracing starts here (see ``repro.collectives_trace``).
    """
    if on_cpu():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        disable_deepspeed_shm_op()
    import deepspeed

    backend = "gloo" if on_cpu() else "nccl"
    if not on_cpu() and "LOCAL_RANK" in os.environ:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    deepspeed.init_distributed(
        dist_backend=backend,
        timeout=datetime.timedelta(seconds=timeout_s),
        verbose=False,
    )
    assert dist.is_initialized()
    # After deepspeed.comm exists: DeepSpeed caches its all-gather / reduce-scatter functions at
    # start-up, and tracing must wrap those too. A no-op unless REPRO_COLLECTIVES_TRACE is set.
    from repro.collectives.record.session import install_from_env

    install_from_env()


def exit_rank_process(code: int = 0) -> None:
    """End a rank program: drop the process group, flush, and leave without C++ static destructors.

    A rank that simply returns from ``main`` runs the interpreter's and C++'s exit handlers while
    gloo and DeepSpeed threads may still be alive; one CI run of the worker benchmark aborted there
    ("terminate called without an active exception", exit -6) after its result was written.
    ``os._exit`` after an explicit ``destroy_process_group`` skips that teardown, as torch's own
    multi-process test harness does.
    """
    import sys

    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
