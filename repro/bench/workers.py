"""Worker benchmark: ``ActorWorker.update_policy`` against a bare DeepSpeed loop and FSDP2, per ZeRO case.

For every case (ZeRO-1/2/3, ZeRO-1/2 with CPU optimizer offload, ZeRO-3 with CPU optimizer and parameter offload;
ZeRO-3 with the decoder layers as leaf modules, the workers' default, and ``zero3_noleaf`` with stock per-submodule
hooks; ``zero3_dsdefaults`` and ``zero3_offload_dsdefaults`` with DeepSpeed's constant bucket/prefetch/persistence sizes
instead of the size-aware ones of ``repro.config.zero3``; ``zero2_overlap*`` with ``overlap_comm``;
``zero3_bucket_5e7`` with a tenth of ZeRO-3's gradient bucket, ``zero3_torch_linear`` with torch's linear,
``zero3_persist_1e7`` also with the layers' weights whole, ``zero3_persist_1e7_stock`` with them gathered after each step
by DeepSpeed's one call per parameter instead of repro's one coalesced call) the runners train the same randomly initialised model on
the same batch, each in its own set of rank processes (peak memory would leak from one case into the next in a shared
process):

- ``worker``: ``ActorWorker.update_policy`` (PPO loss, one mini-batch of ``micro * gas``
  samples per rank, so one optimizer step per call);
- ``bare``: ``deepspeed.initialize`` with the same DeepSpeed JSON and a plain loop of
  ``gas`` x (forward with labels, ``engine.backward``, ``engine.step``);
- ``fsdp2`` and ``fsdp2_each`` (once per round, not per case): PyTorch's ``fully_shard`` loop of
  :mod:`repro.bench.fsdp2_loop`, the gradients reduced once a step (``fsdp2``) or after every micro-batch
  (``fsdp2_each``: verl's default, ``use_no_sync_for_gradient_accumulation=False``, and what ZeRO-2/3 do).

``--rounds N`` repeats every (case, runner) N times, alternating them (round-robin), and reports
the median step time over rounds: compare versions only within one command.

Every sample has ``seq`` real tokens (half prompt, half response). Output: one TSV row per
case and runner (step seconds, tokens/s per GPU, peak allocated/reserved GB), the worker's
throughput as a fraction of the bare loop's, and each row's throughput as a fraction of each FSDP2 loop's.
``--sp 2`` runs the worker with Ulysses sp=2 (dp = nproc / sp): at ``--micro 1`` each GPU holds half
of one sample's tokens at a time instead of a whole sample, the length at which SP is what fits.

    python -m repro.bench.workers --shape qwen3-0.6b --nproc 2             # GPU machine
    python -m repro.bench.workers --shape tiny --steps 1 --cases zero2     # CPU smoke run
    python -m repro.bench.workers --cases zero2,zero2_overlap --runners worker,fsdp2_each --rounds 2  # ZeRO-2's overlap_comm

``--profile DIR``: one more update per worker case, rank 0 under torch.profiler (:mod:`repro.bench.profile_pass`):
``DIR/<case>_worker_r<round>/`` gets the trace and ``phases.md`` (gradient communication and the GPU's idle time
beside the compute phases: where ZeRO-3's step goes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from repro.bench.fsdp2_loop import fsdp2_steps
from repro.bench.shapes import make_model_dir, model_config
from repro.bench.workdir import open_workdir
from repro.collectives.launch.launcher import free_port
from repro.devices import on_cpu

_ON_DEVICE = {"offload": "none", "param_offload": False}
CASES = {
    "zero1": {"zero_stage": 1, **_ON_DEVICE},
    "zero2": {"zero_stage": 2, **_ON_DEVICE},
    "zero3": {"zero_stage": 3, **_ON_DEVICE},
    "zero3_noleaf": {"zero_stage": 3, **_ON_DEVICE, "zero3_leaf_modules": False},
    "zero3_dsdefaults": {"zero_stage": 3, **_ON_DEVICE, "zero3_size_aware": False},
    # ZeRO-3's gradient bucket at 5e7 elements instead of 5e8 (the 0.6B shape's 596M gradients fill 5e8 once, late
    # in the backward: its reduce-scatter barely overlaps the compute), so the reduce-scatters run during the backward:
    "zero3_bucket_5e7": {"zero_stage": 3, **_ON_DEVICE, "reduce_bucket_size": 50_000_000},
    # ZeRO-3 with torch's linear instead of DeepSpeed's autograd function per call (memory_efficient_linear):
    "zero3_torch_linear": {"zero_stage": 3, **_ON_DEVICE, "memory_efficient_linear": False},
    # ... and every parameter below 1e7 elements whole on each rank (all of the 0.6B shape's layer weights, 3.1M at
    # most; the 156M embedding stays sharded): ZeRO-3's per-layer gathers gone, its hooks kept, ~0.9 GB more a rank:
    "zero3_persist_1e7": {"zero_stage": 3, **_ON_DEVICE, "memory_efficient_linear": False,
                          "stage3_param_persistence_threshold": 10_000_000},
    # ... with DeepSpeed's own gather of those weights after each step, one all-gather per parameter (309), where
    # repro's engine makes one coalesced call (repro.workers.zero3_persist_gather; the cases above):
    "zero3_persist_1e7_stock": {"zero_stage": 3, **_ON_DEVICE, "memory_efficient_linear": False,
                                "stage3_param_persistence_threshold": 10_000_000,
                                "zero3_coalesce_persistent_gather": False},
    # ... with DeepSpeed's fetch/release hooks on every module, where repro's engine takes them off the modules whose
    # weights all stay whole (repro.workers.zero3_persist_hooks; the cases above: all but the embedding's):
    "zero3_persist_1e7_hooked": {"zero_stage": 3, **_ON_DEVICE, "memory_efficient_linear": False,
                                 "stage3_param_persistence_threshold": 10_000_000,
                                 "zero3_unhook_persistent_modules": False},
    # ZeRO-2 reducing on DeepSpeed's side stream during the backward, in buckets of 5e7 / 2e8 elements (5e8 unset):
    "zero2_overlap": {"zero_stage": 2, **_ON_DEVICE, "overlap_comm": True, "reduce_bucket_size": 50_000_000},
    "zero2_overlap_2e8": {"zero_stage": 2, **_ON_DEVICE, "overlap_comm": True, "reduce_bucket_size": 200_000_000},
    "zero1_offload": {"zero_stage": 1, "offload": "cpu", "param_offload": False},
    "zero2_offload": {"zero_stage": 2, "offload": "cpu", "param_offload": False},
    "zero3_offload": {"zero_stage": 3, "offload": "cpu", "param_offload": True},
    "zero3_offload_dsdefaults": {"zero_stage": 3, "offload": "cpu", "param_offload": True, "zero3_size_aware": False},
}
RUNNERS = ("worker", "bare", "fsdp2", "fsdp2_each")
FSDP2 = ("fsdp2", "fsdp2_each")
COLUMNS = ("case", "runner", "step_s", "tokens_per_s_per_gpu", "max_allocated_gb", "max_reserved_gb",
           "worker_vs_bare", "vs_fsdp2", "optimizer_on", "params_on", "vs_fsdp2_each")


def _run_config(model_dir: str, case: str, args: argparse.Namespace, world: int):
    from repro.config import DeepSpeedConfig, RunConfig

    cfg = RunConfig()
    cfg.trainer.n_gpus_per_node, cfg.trainer.nnodes = world, 1
    per_rank = args.micro * args.gas
    cfg.data.train_batch_size = per_rank * world
    cfg.data.max_prompt_length = args.seq // 2
    cfg.data.max_response_length = args.seq - args.seq // 2
    arr = cfg.actor_rollout_ref
    arr.rollout.n = 1
    arr.model.path = model_dir
    arr.model.enable_gradient_checkpointing = not args.no_gradient_checkpointing
    actor = arr.actor
    actor.ppo_mini_batch_size = per_rank * world
    actor.ppo_micro_batch_size_per_gpu = args.micro
    actor.optim.lr = 1e-6
    actor.deepspeed = DeepSpeedConfig(**CASES.get(case, CASES["zero2"]), step_each_micro=False, fp32_grad_accum=False)
    actor.ulysses_sequence_parallel_size = args.sp
    return cfg


def _batch(args: argparse.Namespace, vocab: int, rank: int):
    import torch

    gen = torch.Generator().manual_seed(1000 + rank)
    b, p = args.micro * args.gas, args.seq // 2
    r = args.seq - p
    input_ids = torch.randint(3, vocab, (b, args.seq), generator=gen)
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones(b, args.seq, dtype=torch.long),
        "position_ids": torch.arange(args.seq).expand(b, -1).clone(),
        "responses": input_ids[:, p:].clone(),
        "response_mask": torch.ones(b, r, dtype=torch.long),
        "old_log_probs": -torch.rand(b, r, generator=gen) * 5,
        "advantages": torch.randn(b, r, generator=gen),
    }


def add_case_process_args(parser: argparse.ArgumentParser) -> None:
    """Output options, and the hidden ones by which a benchmark runs each case in a child process."""
    parser.add_argument("--workdir", default=None,
                        help="the model folder (shared) and, in a run_* folder of each command's own, logs and results")
    parser.add_argument("--out", default=None, help="also write the TSV here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)


def _sync() -> None:
    if not on_cpu():
        import torch

        torch.cuda.synchronize()


def _timed_steps(args: argparse.Namespace, step) -> list[float]:
    times = []
    for _ in range(args.warmup + args.steps):
        _sync()
        start = time.perf_counter()
        step()
        _sync()
        times.append(time.perf_counter() - start)
    return times[args.warmup:]


def _bare_deepspeed(args: argparse.Namespace, cfg, ids) -> tuple[list[float], object]:
    import deepspeed

    from repro.config.ds_config import build_ds_config
    from repro.config.rules import plan_role_batch
    from repro.config.zero3 import model_size_of
    from repro.workers.engine import load_hf_model, torch_dtype
    from repro.workers.zero3_leaf import mark_zero3_leaves

    ds = cfg.actor_rollout_ref.actor.deepspeed
    model = load_hf_model(cfg.actor_rollout_ref.model, torch_dtype(ds))
    if ds.zero_stage == 3 and ds.zero3_leaf_modules:
        mark_zero3_leaves(model)
    conf = build_ds_config(ds, cfg.actor_rollout_ref.actor.optim, plan_role_batch(cfg, "actor"),
                           grad_clip=1.0, on_cuda=not on_cpu(),
                           model_size=model_size_of(model) if ds.zero3_size_aware else None)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=conf)
    engine.train()
    ids = ids.to(engine.device)

    def step() -> None:
        for g in range(args.gas):
            mb = ids[g * args.micro:(g + 1) * args.micro]
            engine.backward(engine(input_ids=mb, labels=mb, use_cache=False).loss)
            engine.step()

    return _timed_steps(args, step), engine


def _child(args: argparse.Namespace) -> None:
    """One rank of one (case, runner): train ``warmup + steps`` steps and report step times."""
    import torch.distributed as dist

    from repro.cluster.process_group import init_distributed
    from repro.workers.engine import memory_metrics
    from repro.workers.placement import optimizer_placement, param_placement

    init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = _run_config(args.model_dir, args.case, args, world)
    batch = _batch(args, model_config(args.shape).vocab_size, rank)
    engine = None
    if args.runner == "worker":
        from repro.workers.actor import ActorWorker

        worker = ActorWorker(cfg)
        measured = _timed_steps(args, lambda: worker.update_policy(batch))
        engine = worker.engine.engine
        if args.profile:  # every rank updates once more; rank 0 under the profiler
            from repro.bench.profile_pass import batch_counts, profile_pass

            print(profile_pass(lambda: worker.update_policy(batch),
                               Path(args.profile) / Path(args.result).stem if rank == 0 else None,
                               f"{args.case}/{args.runner}", worker.engine.module, args.warmup + args.steps + 1,
                               worker.engine.device, batch_counts(model_config(args.shape), batch)), flush=True)
    elif args.runner == "bare":
        measured, engine = _bare_deepspeed(args, cfg, batch["input_ids"])
    else:  # fsdp2 reduces once a step (gradient sync on the last micro-batch), fsdp2_each after every micro-batch
        measured = fsdp2_steps(args, cfg, batch["input_ids"], _timed_steps, each_micro=args.runner == "fsdp2_each")
    step_s = statistics.median(measured)
    zero3 = getattr(engine, "optimizer", None)
    if rank == 0 and engine is not None:  # what DeepSpeed really took, into the case's log
        from repro.workers.zero3_linear import linear_in_use

        print(f"# overlap_comm={engine.zero_overlap_comm()} reduce_bucket_size={engine.zero_reduce_bucket_size()} "
              f"linear={linear_in_use()}", flush=True)
    if rank == 0 and hasattr(zero3, "prefetch_elements"):
        from repro.workers.engaged import zero3_persistent_params
        from repro.workers.zero3_persist_gather import persistent_gather
        from repro.workers.zero3_persist_hooks import hooked_modules

        print(f"# zero3 sizes: reduce_bucket_size={zero3.reduce_bucket_size} prefetch={zero3.prefetch_elements} "
              f"persistence={zero3.parameter_offload.param_numel_persistence_threshold} persistent_params="
              f"{zero3_persistent_params(engine.module)} gather={persistent_gather(zero3)} "
              f"hooked_modules={hooked_modules(engine)}", flush=True)
    mem = memory_metrics()
    gathered: list = [None] * world
    dist.all_gather_object(gathered, {"step_s": step_s, "alloc": mem["perf/max_memory_allocated_gb"],
                                      "reserved": mem["perf/max_memory_reserved_gb"]})
    if rank == 0:
        row = {
            "case": args.case, "runner": args.runner,
            "step_s": max(g["step_s"] for g in gathered),
            "max_allocated_gb": max(g["alloc"] for g in gathered),
            "max_reserved_gb": max(g["reserved"] for g in gathered),
            # Read from the engine, not the config (FSDP2: torch AdamW on the accelerator).
            "optimizer_on": optimizer_placement(engine) if engine is not None else "device",
            "params_on": param_placement(engine) if engine is not None else "device",
        }
        row["tokens_per_s_per_gpu"] = args.micro * args.gas * args.seq / row["step_s"]
        Path(args.result).write_text(json.dumps(row))
    dist.barrier()


def _launch(args: argparse.Namespace, case: str, runner: str, model_dir: Path, run_dir: Path, round_: int = 0) -> dict:
    """Start ``nproc`` rank processes for one (case, runner), torchrun-style, and read rank 0's row."""
    port = free_port()
    result = run_dir / f"{case}_{runner}_r{round_}.json"
    log = run_dir / f"{case}_{runner}_r{round_}.log"
    cmd = [sys.executable, "-m", "repro.bench.workers", "--child", "--case", case, "--runner", runner,
           "--model-dir", str(model_dir), "--result", str(result), "--shape", args.shape,
           "--seq", str(args.seq), "--micro", str(args.micro), "--gas", str(args.gas), "--sp", str(args.sp),
           "--steps", str(args.steps), "--warmup", str(args.warmup)]
    if args.no_gradient_checkpointing:
        cmd.append("--no-gradient-checkpointing")
    if args.profile and runner == "worker":
        cmd += ["--profile", args.profile]
    procs = []
    with open(log, "w") as out:
        for rank in range(args.nproc):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.nproc), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(args.nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + args.timeout
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        for p in [p for p in procs if p.poll() is None]:
            p.kill()
    if any(c != 0 for c in codes) or not result.is_file():
        tail = log.read_text()[-4000:]
        raise RuntimeError(f"{case}/{runner} failed (exit codes {codes}); log {log}:\n{tail}")
    return json.loads(result.read_text())


def _median_rows(rows: list[dict]) -> list[dict]:
    """One row per (case, runner): the median step time over rounds, the peak memory over rounds."""
    out: dict[tuple[str, str], dict] = {}
    for key in dict.fromkeys((r["case"], r["runner"]) for r in rows):
        mine = [r for r in rows if (r["case"], r["runner"]) == key]
        row = dict(mine[0], step_s=statistics.median(r["step_s"] for r in mine),
                   max_allocated_gb=max(r["max_allocated_gb"] for r in mine),
                   max_reserved_gb=max(r["max_reserved_gb"] for r in mine))
        row["tokens_per_s_per_gpu"] = statistics.median(r["tokens_per_s_per_gpu"] for r in mine)
        out[key] = row
    return list(out.values())


def _format(rows: list[dict]) -> str:
    bare = {r["case"]: r for r in rows if r["runner"] == "bare"}
    ref = {name: next((r for r in rows if r["runner"] == name), None) for name in FSDP2}
    lines = ["\t".join(COLUMNS)]
    for r in rows:
        ratio = ""
        if r["runner"] == "worker" and r["case"] in bare:
            ratio = f"{r['tokens_per_s_per_gpu'] / bare[r['case']]['tokens_per_s_per_gpu']:.3f}"
        vs = {name: f"{r['tokens_per_s_per_gpu'] / f['tokens_per_s_per_gpu']:.3f}" if f else "" for name, f in ref.items()}
        lines.append("\t".join([r["case"], r["runner"], f"{r['step_s']:.4f}", f"{r['tokens_per_s_per_gpu']:.1f}",
                                f"{r['max_allocated_gb']:.2f}", f"{r['max_reserved_gb']:.2f}", ratio, vs["fsdp2"],
                                r.get("optimizer_on", ""), r.get("params_on", ""), vs["fsdp2_each"]]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen3-0.6b", help="qwen3-0.6b (GPU) or tiny (CPU smoke run)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {list(CASES)}")
    parser.add_argument("--runners", default=",".join(RUNNERS), help=f"comma-separated subset of {list(RUNNERS)}")
    parser.add_argument("--rounds", type=int, default=1, help="alternate every (case, runner) this many times")
    parser.add_argument("--nproc", type=int, default=2, help="ranks per case")
    parser.add_argument("--seq", type=int, default=1024, help="tokens per sample (half prompt, half response)")
    parser.add_argument("--micro", type=int, default=2)
    parser.add_argument("--sp", type=int, default=1, help="Ulysses sequence parallel size (worker runner only)")
    parser.add_argument("--gas", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5, help="measured steps (median reported)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--no-gradient-checkpointing", action="store_true")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per case and runner")
    parser.add_argument("--profile", default="",
                        help="folder: one more update per worker case under torch.profiler (rank 0), and its phases.md")
    add_case_process_args(parser)
    parser.add_argument("--runner", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        from repro.cluster.process_group import exit_rank_process

        _child(args)
        exit_rank_process(0)
    cases = [c for c in args.cases.split(",") if c]
    runners = [r for r in args.runners.split(",") if r]
    bad = [f"--cases: {c!r} is not valid; choose from {list(CASES)}" for c in cases if c not in CASES]
    bad += [f"--runners: {r!r} is not valid; choose from {list(RUNNERS)}" for r in runners if r not in RUNNERS]
    bad += [f"--rounds={args.rounds} is not valid; it must be >= 1"] if args.rounds < 1 else []
    if args.sp < 1 or args.nproc % args.sp or (args.sp > 1 and runners != ["worker"]):
        bad.append(f"--sp={args.sp} is not valid; it must divide --nproc={args.nproc}, and above 1 needs "
                   f"--runners worker (the bare loop and FSDP2 do not shard sequences)")
    if bad:
        print(f"error: {bad[0]}", file=sys.stderr)
        return 2
    # FSDP2 does not depend on the ZeRO case: one run per round, before the cases.
    plan = [(r, r) for r in FSDP2 if r in runners] + [
        (case, runner) for case in cases for runner in runners if runner not in FSDP2]
    workdir, run_dir = open_workdir(args.workdir, "repro_bench_")
    model_dir = make_model_dir(args.shape, workdir / f"model_{args.shape}")
    rows = []
    for round_ in range(args.rounds):
        for case, runner in plan:
            rows.append(_launch(args, case, runner, model_dir, run_dir, round_))
            print(f"# round {round_ + 1}/{args.rounds} {case}/{runner}: {rows[-1]['step_s']:.3f} s/step",
                  file=sys.stderr, flush=True)
    table = _format(_median_rows(rows))
    print(table, flush=True)
    if args.out:
        Path(args.out).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
