"""A CPU platform for verl, so that verl's own helpers run on CPU ranks (gloo).

verl 0.9.1 knows CUDA, NPU and ROCm platforms only and falls back to ``nvidia`` on a CPU host,
so its micro-batching (``rearrange_micro_batches`` puts a count on ``get_device_name()`` before
an all-reduce) and ``get_device_id()`` ask torch for CUDA and fail. repro runs DeepSpeed on CPU
with ``DS_ACCELERATOR=cpu`` (``repro.devices.on_cpu``); there the plugin makes this platform
verl's current one (``VERL_PLATFORM=cpu`` selects it too). CUDA hosts keep verl's own.
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform import platform_manager
from verl.plugin.platform.platform_base import PlatformBase


class PlatformCPU(PlatformBase):
    """CPU tensors, gloo collectives, no device state."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return torch.cpu

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        # ``torch.device("cpu", 0)`` is the CPU; tensors moved ``.to(0)`` would mean CUDA, so
        # callers get the device by name (verl's engines use get_device_id() with .to()).
        return "cpu"  # type: ignore[return-value]

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def use_cpu_platform_if_cpu() -> None:
    """Make :class:`PlatformCPU` verl's platform when DeepSpeed runs on CPU (or VERL_PLATFORM=cpu)."""
    import os

    from repro.devices import on_cpu

    platform_manager.PlatformRegistry.register(platform="cpu")(PlatformCPU)
    wanted = os.environ.get("VERL_PLATFORM", "").strip().lower()
    if wanted == "cpu" or (not wanted and on_cpu()):
        current = platform_manager._current_platform
        if current is None or current.device_name != "cpu":
            platform_manager._current_platform = PlatformCPU()
