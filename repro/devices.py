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
        index = _nvml_indices(1 + torch.cuda.current_device())[torch.cuda.current_device()]
        return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).used / 2**30
    except Exception:  # noqa: BLE001 - NVML is a best-effort second opinion on memory
        return None


def _nvml_indices(count: int) -> list[int]:
    """NVML's (physical) numbers of this process's first ``count`` CUDA devices: NVML numbers devices
    physically and ``CUDA_VISIBLE_DEVICES`` may renumber them (UUIDs are left as they are)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if visible and not visible.startswith("GPU-"):
        return [int(i) for i in visible.split(",")][:count]
    return list(range(count))


class NvmlPeak:
    """The most memory the driver saw in use on any of this process's GPUs while the block ran (NVML,
    sampled every ``period`` s by a thread): what every process on them held, a child's vLLM engine
    included. ``peak_gb`` stays 0.0 where there is no driver."""

    def __init__(self, period: float = 0.2) -> None:
        import threading

        self.period, self.peak_gb = period, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> NvmlPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in _nvml_indices(pynvml.nvmlDeviceGetCount())]
        except Exception:  # noqa: BLE001 - no driver: no figure
            return
        while not self._stop.wait(self.period):
            self.peak_gb = max(self.peak_gb, max(pynvml.nvmlDeviceGetMemoryInfo(h).used for h in handles) / 2**30)
        pynvml.nvmlShutdown()
