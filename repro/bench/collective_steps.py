"""What the collective tracer costs per training step: a DDP step and a ZeRO-2 step of a small MLP.

Part 4 of :mod:`repro.bench.collectives` (``--small-steps``): the modes are alternated round by
round in one process, so the machine's load drifts over all of them alike; the min-max of the
per-round ratios to the untraced step is the spread on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _traced(mode: str, out_dir: str, timeout_s: float = 60.0) -> Any:
    import contextlib

    from repro.collectives_trace import trace_collectives

    if mode == "off":
        return contextlib.nullcontext()
    return trace_collectives(out_dir, check="off" if mode == "record" else mode, timeout_s=timeout_s)


STEP_MODES = ("off", "record", "every")


def small_steps(args: argparse.Namespace, device: Any, tmp: str, modes: tuple[str, ...]) -> dict[str, Any]:
    """Seconds per training step (median, and the spread of per-round ratios to ``off``) for DDP and ZeRO-2."""
    import deepspeed
    import torch

    def mlp() -> torch.nn.Module:
        torch.manual_seed(0)
        layers: list[torch.nn.Module] = []
        for _ in range(args.mlp_layers):
            layers += [torch.nn.Linear(args.mlp_width, args.mlp_width), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers).to(device)

    x = torch.randn(args.micro_batch * 16, args.mlp_width, device=device)
    ddp = torch.nn.parallel.DistributedDataParallel(mlp(), bucket_cap_mb=args.bucket_mb)
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)

    def ddp_step() -> None:
        ddp(x).square().mean().backward()
        ddp_opt.step()
        ddp_opt.zero_grad()

    bucket = int(args.bucket_mb * 2**20 / 4)
    engine, *_ = deepspeed.initialize(
        model=mlp(),
        config={
            "train_micro_batch_size_per_gpu": args.micro_batch * 16,
            "optimizer": {"type": "SGD", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": 2, "reduce_bucket_size": bucket, "allgather_bucket_size": bucket},
            "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**9,
        },
    )

    def zero2_step() -> None:
        engine.backward(engine(x).square().mean())
        engine.step()

    out: dict[str, Any] = {}
    for name, step in (("ddp", ddp_step), ("zero2", zero2_step)):
        for _ in range(args.warmup):
            step()
        times: dict[str, list[float]] = {m: [] for m in modes}
        calls: dict[str, int] = {}
        for r in range(args.steps):
            for mode in modes:
                with _traced(mode, os.path.join(tmp, f"{name}_{mode.replace(':', '')}_{r}")) as tracer:
                    start = time.perf_counter()
                    for _ in range(args.steps_per_round):
                        step()
                    _sync(device)
                    times[mode].append((time.perf_counter() - start) / args.steps_per_round)
                if tracer is not None:
                    calls[mode] = tracer._index // args.steps_per_round
        med = {m: statistics.median(v) for m, v in times.items()}
        spread = {}
        if "off" in times:
            for m in modes:
                ratios = sorted(a / b for a, b in zip(times[m], times["off"], strict=False))
                spread[m] = [ratios[0], ratios[-1]]
        out[name] = {"step_s": med, "ratio_min_max": spread, "calls_per_step": calls.get("record")}
    return out


def steps_table(r: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "Per training step (small MLP): median s per step, ratio to untraced, min-max of the per-round ratios",
        "| step | mode | s per step | vs off | per-round ratio min-max | traced calls per step |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, z in r["small_steps"].items():
        off = z["step_s"]["off"]
        for m in STEP_MODES:
            lo, hi = z["ratio_min_max"][m]
            label = "check=every" if m == "every" else m
            lines.append(
                f"| {name} | {label} | {z['step_s'][m]:.4f} | {z['step_s'][m] / off:.3f}x | "
                f"{lo:.2f}-{hi:.2f} | {z['calls_per_step'] if m != 'off' else '-'} |"
            )
        if "detail_steps" in r:
            d = r["detail_steps"][name]["step_s"]["off"]
            lines.append(f"| {name} | TORCH_DISTRIBUTED_DEBUG=DETAIL (no tracer) | {d:.4f} | {d / off:.3f}x | - | - |")
            for m in ("record", "every"):
                lines.append(f"| {name} | {m} vs DETAIL | - | {z['step_s'][m] / d:.3f}x | - | - |")
    return lines
