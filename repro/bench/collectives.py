"""Benchmark of the collective tracer: cost per call, time to report, ZeRO-2 step overhead.

    python -m repro.bench.collectives                          # 2 gloo ranks, CPU
    python -m repro.bench.collectives --backend nccl --zero2   # 2 GPUs, ZeRO-2 step at the Qwen3-0.6B shape

Parts (each on ``--nproc`` spawned ranks):

1. cost per small all_reduce (``--numel`` elements) in modes off / record / check=every /
   check=sample:10 / detail (untraced, on a group made under torch's debug level DETAIL, as
   ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` makes every group), the modes alternated over ``--rounds``
   rounds of ``--iters`` calls (medians);
2. time from the divergent call to the raised report: a size mismatch in one group, and crossed
   calls on two groups (the ZeRO-2 hang's shape), in check mode ``every``;
3. with ``--zero2``: DeepSpeed ZeRO-2 training step time of a Qwen3-shaped model (shape flags),
   modes alternated step by step, medians over ``--steps`` steps per mode;
4. with ``--small-steps``: what a user pays per training step, a DDP step and a ZeRO-2 step of a
   small MLP (``--mlp-layers`` x ``--mlp-width``, small buckets so a step issues several bucket
   collectives), modes off / record / check=every / detail alternated round by round
   (:mod:`repro.bench.collective_steps`). ``--steps-only`` skips parts 1 and 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

from repro.bench.collective_steps import _sync, _traced, detail_group
from repro.collectives.launch.launcher import free_port

MODES = ("off", "record", "every", "sample:10")
CALL_MODES = (*MODES, "detail")


def _per_call(
    args: argparse.Namespace, device: Any, tmp: str, modes: tuple[str, ...] = CALL_MODES
) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    t = torch.ones(args.numel, device=device)
    wrapped = detail_group()
    samples: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds + 1):  # round 0 warms up
        for mode in modes:
            group = wrapped if mode == "detail" else None
            dist.barrier()
            with _traced(mode, os.path.join(tmp, f"calls_{mode.replace(':', '')}")):
                _sync(device)
                start = time.perf_counter()
                for _ in range(args.iters):
                    dist.all_reduce(t, group=group)
                _sync(device)
                elapsed = time.perf_counter() - start
            if r:
                samples[mode].append(elapsed / args.iters * 1e6)
    return {m: statistics.median(v) for m, v in samples.items()}


def _native_call(args: argparse.Namespace, device: Any, tmp: str) -> dict[str, dict[str, float]]:
    """A 1-element all_reduce issued from C++ (``ProcessGroup.allreduce``, as DDP's reducer does):
    wall and this process's CPU time per call, off against record, alternated over the rounds."""
    import torch
    import torch.distributed as dist

    pg = dist.distributed_c10d._get_default_group()
    t = torch.ones(1, device=device)
    wall: dict[str, list[float]] = {"off": [], "record": []}
    cpu: dict[str, list[float]] = {"off": [], "record": []}
    for r in range(args.rounds + 1):  # round 0 warms up
        for mode in ("off", "record"):
            dist.barrier()
            with _traced(mode, os.path.join(tmp, f"native_{mode}")):
                start, start_cpu = time.perf_counter(), time.process_time()
                for _ in range(args.iters):
                    pg.allreduce([t]).wait()
                if r:
                    wall[mode].append((time.perf_counter() - start) / args.iters * 1e6)
                    cpu[mode].append((time.process_time() - start_cpu) / args.iters * 1e6)
    return {
        "wall_us": {m: statistics.median(v) for m, v in wall.items()},
        "cpu_us": {m: statistics.median(v) for m, v in cpu.items()},
    }


def _record_cpu_us(device: Any, tmp: str, n: int = 2000) -> float:
    """Tracer CPU work per call in record mode (describe, call site, two file writes), no collective."""
    import torch

    t = torch.ones(1, device=device)
    with _traced("record", os.path.join(tmp, "cpu")) as tracer:
        start = time.perf_counter()
        for _ in range(n):
            tracer.after(tracer.before("all_reduce", (t,), {}))
        return (time.perf_counter() - start) / n * 1e6


def _time_to_report(device: Any, tmp: str, crossed: bool) -> float:
    import torch
    import torch.distributed as dist

    from repro.collectives_trace import CollectiveMismatchError

    rank = dist.get_rank()
    other = dist.new_group(list(range(dist.get_world_size())))
    dist.barrier()
    with _traced("every", os.path.join(tmp, "crossed" if crossed else "size"), timeout_s=60):
        dist.all_reduce(torch.ones(4, device=device))
        start = time.perf_counter()
        try:
            if crossed:
                # rank 0 on the default group, the others on a second group over the same ranks
                dist.all_reduce(torch.ones(1, device=device), group=None if rank == 0 else other)
            else:
                dist.all_reduce(torch.ones(1 if rank == 0 else 8, device=device))
        except CollectiveMismatchError:
            return time.perf_counter() - start
    raise AssertionError("the divergent call was not reported")


def _zero2_steps(args: argparse.Namespace, device: Any, tmp: str) -> dict[str, Any]:
    import deepspeed
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        max_position_embeddings=max(args.seq, 128),
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg)
    if args.grad_ckpt:
        model.gradient_checkpointing_enable()
    bf16 = device.type == "cuda"
    ds_cfg = {
        "train_micro_batch_size_per_gpu": args.micro_batch,
        "gradient_accumulation_steps": args.gas,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": bf16},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "torch_adam": not args.fused_adam}},
        "zero_optimization": {"stage": 2, "overlap_comm": True, "contiguous_gradients": True},
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_cfg)
    gen = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, args.vocab, (args.gas, args.micro_batch, args.seq), generator=gen).to(device)

    def step() -> float:
        _sync(device)
        start = time.perf_counter()
        for m in range(args.gas):
            loss = engine(input_ids=ids[m], labels=ids[m]).loss
            engine.backward(loss)
            engine.step()
        _sync(device)
        return time.perf_counter() - start

    for _ in range(args.warmup):
        step()
    times: dict[str, list[float]] = {m: [] for m in MODES}
    calls: dict[str, int] = {}
    for s in range(args.steps):
        for mode in MODES:
            out = os.path.join(tmp, f"zero2_{mode.replace(':', '')}_{s}")
            with _traced(mode, out) as tracer:
                times[mode].append(step())
            if tracer is not None:
                calls[mode] = tracer._index
    med = {m: statistics.median(v) for m, v in times.items()}
    return {
        "step_s": med,
        "collectives_per_step": calls.get("record"),
        "params": sum(p.numel() for p in model.parameters()),
    }


def _rank_main(rank: int, args: argparse.Namespace, port: int, result_path: str) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(args.nproc),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    if args.backend == "gloo":
        os.environ["DS_ACCELERATOR"] = "cpu"
    import torch
    import torch.distributed as dist

    from repro.cluster.process_group import init_distributed

    init_distributed(timeout_s=300)
    device = torch.device("cuda", rank) if args.backend == "nccl" else torch.device("cpu")
    results: dict[str, Any] = {
        "backend": dist.get_backend(),
        "nproc": args.nproc,
        "numel": args.numel,
        "iters": args.iters,
        "rounds": args.rounds,
    }
    with tempfile.TemporaryDirectory(prefix="ct_bench_") as tmp:
        if not args.steps_only:
            results["per_call_us"] = _per_call(args, device, tmp)
            results["record_cpu_us"] = _record_cpu_us(device, tmp)
            results["native_call"] = _native_call(args, device, tmp)
            results["report_s"] = {
                "size_mismatch": _time_to_report(device, tmp, crossed=False),
                "crossed_groups": _time_to_report(device, tmp, crossed=True),
            }
        if args.zero2:
            results["zero2"] = _zero2_steps(args, device, tmp)
        if args.small_steps:
            from repro.bench.collective_steps import STEP_MODES, small_steps

            results["small_steps"] = small_steps(args, device, tmp, STEP_MODES)
    if not args.steps_only:
        gathered: list[Any] = [None] * args.nproc
        dist.all_gather_object(gathered, results["report_s"])
        results["report_s_by_rank"] = gathered
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(results, f, indent=2)
    dist.destroy_process_group()


def _call_table(r: dict[str, Any]) -> list[str]:
    base = r["per_call_us"]["off"]
    lines = [
        f"backend {r['backend']}, {r['nproc']} ranks, all_reduce of {r['numel']} elements, "
        f"median of {r['rounds']} rounds x {r['iters']} calls",
        "| mode | us per call | vs off |",
        "| --- | --- | --- |",
    ]
    labels = {"every": "check=every", "detail": "TORCH_DISTRIBUTED_DEBUG=DETAIL group (no tracer)"}
    for m, v in r["per_call_us"].items():
        lines.append(f"| {labels.get(m, m)} | {v:.1f} | {v / base:.2f}x |")
    lines.append(f"tracer CPU work per call in record mode (no collective): {r['record_cpu_us']:.1f} us")
    n = r["native_call"]
    lines.append(
        "the same all_reduce issued from C++ (ProcessGroup.allreduce, as DDP's reducer does), off / record: "
        f"{n['wall_us']['off']:.1f} / {n['wall_us']['record']:.1f} us wall, "
        f"{n['cpu_us']['off']:.1f} / {n['cpu_us']['record']:.1f} us of this process's CPU"
    )
    lines.append("")
    lines.append("| divergence | time from divergent call to report, per rank (s) |")
    lines.append("| --- | --- |")
    for k in ("size_mismatch", "crossed_groups"):
        lines.append(f"| {k} | " + ", ".join(f"{x[k]:.3f}" for x in r["report_s_by_rank"]) + " |")
    return lines


def _table(r: dict[str, Any]) -> str:
    lines = _call_table(r) if "per_call_us" in r else [f"backend {r['backend']}, {r['nproc']} ranks"]
    if "zero2" in r:
        z = r["zero2"]
        off = z["step_s"]["off"]
        lines += [
            "",
            f"ZeRO-2 step ({z['params'] / 1e6:.1f} M params, {z['collectives_per_step']} traced calls per step)",
            "| mode | step s | vs off |",
            "| --- | --- | --- |",
        ]
        lines += [f"| {m} | {z['step_s'][m]:.4f} | {z['step_s'][m] / off:.3f}x |" for m in MODES]
    if "small_steps" in r:
        from repro.bench.collective_steps import steps_table

        lines += steps_table(r)
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m repro.bench.collectives", description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--numel", type=int, default=1)
    p.add_argument("--iters", type=int, default=500)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=None, help="write the results JSON here too")
    p.add_argument("--steps-only", action="store_true", help="skip the per-call and time-to-report parts")
    z = p.add_argument_group("ZeRO-2 step (--zero2); defaults: Qwen3-0.6B shape")
    z.add_argument("--zero2", action="store_true")
    z.add_argument("--hidden-size", type=int, default=1024)
    z.add_argument("--intermediate-size", type=int, default=3072)
    z.add_argument("--layers", type=int, default=28)
    z.add_argument("--heads", type=int, default=16)
    z.add_argument("--kv-heads", type=int, default=8)
    z.add_argument("--head-dim", type=int, default=128)
    z.add_argument("--vocab", type=int, default=151936)
    z.add_argument("--seq", type=int, default=1024)
    z.add_argument("--micro-batch", type=int, default=2)
    z.add_argument("--gas", type=int, default=4)
    z.add_argument("--steps", type=int, default=5, help="measured steps per mode")
    z.add_argument("--warmup", type=int, default=2)
    z.add_argument("--grad-ckpt", action=argparse.BooleanOptionalAction, default=True)
    z.add_argument(
        "--fused-adam", action="store_true", help="DeepSpeed FusedAdam (JIT build) instead of torch AdamW"
    )
    s = p.add_argument_group("per training step of a small model (--small-steps)")
    s.add_argument("--small-steps", action="store_true")
    s.add_argument("--mlp-layers", type=int, default=8)
    s.add_argument("--mlp-width", type=int, default=512)
    s.add_argument("--bucket-mb", type=float, default=0.25, help="DDP bucket cap and ZeRO-2 bucket size (MB)")
    s.add_argument("--steps-per-round", type=int, default=3)
    args = p.parse_args(argv)
    if args.nproc < 2:
        p.error("--nproc must be >= 2 (the divergence part needs two ranks)")
    import torch.multiprocessing as mp

    port = free_port()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "result.json")
        mp.spawn(_rank_main, args=(args, port, path), nprocs=args.nproc, join=True)
        with open(path) as f:
            results = json.load(f)
    results["machine"] = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }
    m = results["machine"]
    print(_table(results))
    print(
        f"machine: {m['cpu']}, {m['cores']} cores; load average (1, 5, 15 min) before "
        f"{', '.join(f'{x:.2f}' for x in m['loadavg_before'])}, after {', '.join(f'{x:.2f}' for x in m['loadavg_after'])}"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
