"""Where this process computes: the one answer to "CPU or CUDA?", and every NVML read.

``DS_ACCELERATOR=cpu`` forces the CPU paths even on a machine with GPUs (the tests and the CPU
runs set it), so every "is CUDA in use" question in the package goes through :func:`on_cpu`.
torch is imported lazily: the driver asks these questions before it needs torch for anything else.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def on_cpu() -> bool:
    """True when DeepSpeed and the workers run on CPU (``DS_ACCELERATOR=cpu``, or no CUDA device)."""
    if os.environ.get("DS_ACCELERATOR", "").lower() == "cpu":
        return True
    import torch

    return not torch.cuda.is_available()


def default_device() -> torch.device:
    """This rank's device: its current CUDA device on GPU runs, else the CPU."""
    import torch

    return torch.device("cpu") if on_cpu() else torch.device("cuda", torch.cuda.current_device())


def visible_gpus() -> int:
    """GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` or NVML, without a CUDA context."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver or no library: no usable GPU
        return 0


def nvml_used_gb() -> float | None:
    """Memory in use on this rank's GPU as the driver sees it (NVML), or None off CUDA.

    NVML counts what the CUDA caching allocator cannot see (other processes, a colocated
    rollout engine, CUDA contexts), so it is reported beside torch's own figures.
    """
    if on_cpu():
        return None
    import torch

    try:
        import pynvml

        pynvml.nvmlInit()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        index = torch.cuda.current_device()
        # NVML numbers devices physically; CUDA_VISIBLE_DEVICES may renumber them (UUIDs are left as is).
        if visible and not visible.startswith("GPU-"):
            index = int(visible.split(",")[index])
        return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).used / 2**30
    except Exception:  # noqa: BLE001 - NVML is a best-effort second opinion on memory
        return None
