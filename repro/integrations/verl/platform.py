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


class _CPUDevice:
    """``torch.cpu`` with the rest of the ``torch.cuda`` surface verl's workers call on the device
    module (``get_torch_device()``: ``aggressive_empty_cache`` and the memory logs read the caching
    allocator's counters, the rollout sync empties the cache): the CPU has no caching allocator, so
    its counters are 0 and its cache calls do nothing."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def _zero(*args: Any, **kwargs: Any) -> int:
        return 0

    @staticmethod
    def _nothing(*args: Any, **kwargs: Any) -> None:
        return None

    memory_reserved = memory_allocated = max_memory_reserved = max_memory_allocated = _zero
    empty_cache = reset_peak_memory_stats = reset_accumulated_memory_stats = ipc_collect = _nothing
    set_per_process_memory_fraction = _nothing

    @staticmethod
    def mem_get_info(*args: Any, **kwargs: Any) -> tuple[int, int]:
        import psutil

        vm = psutil.virtual_memory()
        return vm.available, vm.total

    @staticmethod
    def get_rng_state(*args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def get_device_name(*args: Any, **kwargs: Any) -> str:
        return "cpu"


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
        return _CPU_DEVICE  # type: ignore[return-value]

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
        """Ray's logical ``GPU`` slots, one per rank: verl 0.9.1 places every rank on one accelerator
        slot and counts GPUs (or NPUs) only (``verl/single_controller/ray/base.py``: ``RayResourcePool``
        always asks for the platform's resource, ``ResourcePoolManager._check_resource_available`` sums
        ``GPU``), and for any other name it asks Ray for ``resources={name: n}``
        (``verl/plugin/platform/platform_base.py``), which Ray refuses for ``CPU``. A CPU run therefore
        starts Ray with as many logical GPUs as ranks (``+ray_kwargs.ray_init.num_gpus=<ranks>``); they
        are bookkeeping only (torch sees no CUDA device, DeepSpeed runs on its CPU accelerator)."""
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


_CPU_DEVICE = _CPUDevice()


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
        _gloo_process_group()


def _gloo_process_group() -> None:
    """verl's workers start their process group with ``backend=f"cpu:gloo,{device}:{backend}"``
    (``verl/utils/distributed.py``, ``initialize_global_process_group_ray``), which on the CPU
    platform is ``cpu:gloo,cpu:gloo``, refused by torch ("Duplicate device type cpu"); the function
    takes a ``backend`` argument that verl's callers leave unset, so its default becomes plain gloo."""
    from verl.utils import distributed

    init = distributed.initialize_global_process_group_ray
    if init.__defaults__ == (None, None):
        init.__defaults__ = (None, "gloo")
