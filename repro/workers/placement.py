"""Where a DeepSpeed engine really keeps its optimizer states and parameters, read from the engine.

The config says what was asked; DeepSpeed decides what happens (a stage may ignore an offload
section). So the placement is read from the built ZeRO optimizer: its offload switch
(``cpu_offload`` at stage 1/2, ``offload_optimizer`` / ``offload_param`` at stage 3) and the device
of the tensors it really updates (the fp32 master partitions the optimizer updates, the
parameters' ZeRO-3 partitions). On a CPU accelerator every tensor is on the CPU anyway, so there
the switch is what separates "offloaded" from "on the accelerator".
"""

from __future__ import annotations

from typing import Any

OFFLOADED = "cpu_offload"
ON_DEVICE = "device"


def _devices(tensors: Any) -> set[str]:
    return {t.device.type for t in tensors}


def optimizer_placement(engine: Any) -> str:
    """``cpu_offload`` when the ZeRO optimizer offloads and its master partitions are on the CPU,
    ``device`` when they stay on the accelerator, ``none`` without an optimizer."""
    zero = getattr(engine, "optimizer", None)
    inner = getattr(zero, "optimizer", None)
    if zero is None or inner is None:
        return "none"
    switch = bool(getattr(zero, "cpu_offload", False) or getattr(zero, "offload_optimizer", False))
    # Stage 1/2 keep the fp32 master partitions in single_partition_of_fp32_groups, stage 3 in
    # fp32_partitioned_groups_flat (its inner optimizer's param_groups are empty between steps).
    flat = getattr(zero, "single_partition_of_fp32_groups", None) or getattr(zero, "fp32_partitioned_groups_flat", None)
    masters = _devices(flat if flat else (p for group in inner.param_groups for p in group["params"]))
    return OFFLOADED if switch and masters == {"cpu"} else ON_DEVICE


def param_placement(engine: Any) -> str:
    """``cpu_offload`` when ZeRO-3 keeps the parameter partitions on the CPU, else ``device``."""
    zero = getattr(engine, "optimizer", None)
    module = engine.module
    partitions = [p.ds_tensor for p in module.parameters() if hasattr(p, "ds_tensor")]
    if not partitions:
        return ON_DEVICE
    switch = bool(getattr(zero, "offload_param", False))
    return OFFLOADED if switch and _devices(partitions) == {"cpu"} else ON_DEVICE


def placement_metrics(engine: Any) -> dict[str, float]:
    """The placement as two 0/1 metrics (a metrics.tsv row holds numbers)."""
    return {
        "ds/optimizer_offloaded": float(optimizer_placement(engine) == OFFLOADED),
        "ds/params_offloaded": float(param_placement(engine) == OFFLOADED),
    }
