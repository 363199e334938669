"""What the collective tracer costs per training step: a DDP step and a ZeRO-2 step of a small MLP.

Part 4 of :mod:`repro.bench.collectives` (``--small-steps``). Four modes, alternated round by
round in the same two processes, so the machine's load drifts over all of them alike: ``off``
(untraced), ``record``, ``every`` (check every call) and ``detail``: untraced, on a process group
made while torch's debug level was DETAIL, which is what ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` does
to every group (torch wraps it in its ProcessGroupWrapper, which checks each collective's shape
across the ranks before running it; nothing in gloo or DeepSpeed reads the level per call). The
``detail`` mode has its own ZeRO-2 engine on that group, started from the same weights. It has no
DDP step: with torch 2.13, DDP built on a wrapped group crashes (SIGSEGV in its logger's
``set_construction_data_and_log``), whether the level came from the environment at start-up or
was set at run time. The min-max of the per-round ratios to ``off`` is the spread on a shared
machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _traced(mode: str, out_dir: str, timeout_s: float = 60.0) -> Any:
    from repro.collectives_trace import trace_collectives

    if mode in ("off", "detail"):
        return contextlib.nullcontext()
    return trace_collectives(out_dir, check="off" if mode == "record" else mode, timeout_s=timeout_s)


STEP_MODES = ("off", "record", "every", "detail")


@contextlib.contextmanager
def _debug_detail() -> Iterator[None]:
    """torch's distributed debug level DETAIL while the block builds groups and models."""
    import torch.distributed as dist

    before = dist.get_debug_level()
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    try:
        yield
    finally:
        dist.set_debug_level(before)


def _steps(args: argparse.Namespace, device: Any, detail_group: Any = None) -> dict[str, Callable[[], None]]:
    """A DDP step and a ZeRO-2 step, each with its own model; only ZeRO-2, on ``detail_group``, if given."""
    import deepspeed
    import torch
    from deepspeed.utils import groups

    def mlp() -> torch.nn.Module:
        torch.manual_seed(0)
        layers: list[torch.nn.Module] = []
        for _ in range(args.mlp_layers):
            layers += [torch.nn.Linear(args.mlp_width, args.mlp_width), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers).to(device)

    x = torch.randn(args.micro_batch * 16, args.mlp_width, device=device)
    bucket = int(args.bucket_mb * 2**20 / 4)
    config = {
        "train_micro_batch_size_per_gpu": args.micro_batch * 16,
        "optimizer": {"type": "SGD", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 2, "reduce_bucket_size": bucket, "allgather_bucket_size": bucket},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    # DeepSpeed caches one clone of the world group for every engine: the DETAIL engine is given
    # the wrapped group in its place, and the cache is put back for the others.
    cached = groups._WORLD_GROUP
    if detail_group is not None:
        groups._WORLD_GROUP = detail_group
    engine, *_ = deepspeed.initialize(model=mlp(), config=config)
    groups._WORLD_GROUP = cached

    def zero2_step() -> None:
        engine.backward(engine(x).square().mean())
        engine.step()

    if detail_group is not None:
        return {"zero2": zero2_step}
    ddp = torch.nn.parallel.DistributedDataParallel(mlp(), bucket_cap_mb=args.bucket_mb)
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)

    def ddp_step() -> None:
        ddp(x).square().mean().backward()
        ddp_opt.step()
        ddp_opt.zero_grad()

    return {"ddp": ddp_step, "zero2": zero2_step}


def detail_group() -> Any:
    """A group over all ranks wrapped as under ``TORCH_DISTRIBUTED_DEBUG=DETAIL``; the level is put back."""
    import torch.distributed as dist

    with _debug_detail():
        return dist.new_group(list(range(dist.get_world_size())))


def small_steps(args: argparse.Namespace, device: Any, tmp: str, modes: tuple[str, ...]) -> dict[str, Any]:
    """Seconds per training step (median, and the spread of per-round ratios to ``off``) for DDP and ZeRO-2."""
    built = {"off": _steps(args, device)}
    if "detail" in modes:
        built["detail"] = _steps(args, device, detail_group())
    out: dict[str, Any] = {}
    for name in ("ddp", "zero2"):
        # The traced modes run the untraced models: tracing changes nothing in them.
        steps = {m: built["detail" if m == "detail" else "off"].get(name) for m in modes}
        steps = {m: f for m, f in steps.items() if f is not None}
        # In the same order on every rank (a set's order is not: the ranks then wait in different groups).
        for f in dict.fromkeys(steps.values()):
            for _ in range(args.warmup):
                f()
        run = tuple(steps)
        times: dict[str, list[float]] = {m: [] for m in run}
        cpu: dict[str, list[float]] = {m: [] for m in run}
        calls: dict[str, int] = {}
        for r in range(args.steps):
            # Each round starts with another mode, so none always runs right after a given other.
            for mode in run[r % len(run) :] + run[: r % len(run)]:
                step = steps[mode]
                with _traced(mode, os.path.join(tmp, f"{name}_{mode}_{r}")) as tracer:
                    # Untimed: a job is traced from start to end, so what the first call after
                    # installing costs (the dispatcher's caches rebuilt) is no per-step cost.
                    step()
                    start, start_cpu = time.perf_counter(), time.process_time()
                    for _ in range(args.steps_per_round):
                        step()
                    _sync(device)
                    times[mode].append((time.perf_counter() - start) / args.steps_per_round)
                    cpu[mode].append((time.process_time() - start_cpu) / args.steps_per_round)
                if tracer is not None:
                    calls[mode] = tracer._index // (args.steps_per_round + 1)
        med = {m: statistics.median(v) for m, v in times.items()}
        spread = {}
        for m in run:
            ratios = sorted(a / b for a, b in zip(times[m], times["off"], strict=False))
            spread[m] = [ratios[0], ratios[-1]]
        out[name] = {
            "step_s": med,
            "ratio_min_max": spread,
            "ratios": {m: [a / b for a, b in zip(times[m], times["off"], strict=False)] for m in run},
            "calls_per_step": calls.get("record"),
            "cpu_s": {m: statistics.median(v) for m, v in cpu.items()},
        }
    return out


_LABELS = {"every": "check=every", "detail": "TORCH_DISTRIBUTED_DEBUG=DETAIL (no tracer)"}


def steps_table(r: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "Per training step (small MLP), modes alternated round by round: median s per step, its ratio to",
        "untraced, median and min-max of the per-round ratios (each round's mode against that round's off);",
        "CPU s per step: this process's CPU time (all its threads), less sensitive to other jobs' load",
        "| step | mode | s per step | vs off (medians) | per-round ratio median | min-max | CPU s per step "
        "| CPU vs off | traced calls per step |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, z in r["small_steps"].items():
        off = z["step_s"]["off"]
        for m in z["step_s"]:
            lo, hi = z["ratio_min_max"][m]
            c = z["cpu_s"][m]
            lines.append(
                f"| {name} | {_LABELS.get(m, m)} | {z['step_s'][m]:.4f} | {z['step_s'][m] / off:.3f}x | "
                f"{statistics.median(z['ratios'][m]):.3f}x | {lo:.2f}-{hi:.2f} | {c:.4f} | "
                f"{c / z['cpu_s']['off']:.3f}x | {z['calls_per_step'] if m in ('record', 'every') else '-'} |"
            )
        if "detail" in z["step_s"]:
            d = z["step_s"]["detail"]
            for m in ("record", "every"):
                lines.append(
                    f"| {name} | {_LABELS.get(m, m)} vs DETAIL | - | {z['step_s'][m] / d:.3f}x | - | - | - | - | - |"
                )
    return lines
