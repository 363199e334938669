"""What one RL step's actor passes make the host and the network do, per ZeRO case, counted on 2 CPU ranks.

The work a launch-bound GPU step pays for on its host (operators dispatched, Python calls) and the collectives it
issues depend on the model's structure, the batch split and the ZeRO case, not on the machine, so a CPU counts a GPU
run's, before any GPU is spent. ``repro.workers.actor.ActorWorker`` is built from a preset (default ``grpo_0p6b``,
the seed's run: remove-padding, token budgets, checkpointing and its actor batch split) on 2 gloo ranks, with a bench
shape (default ``qwen3-0.6b-narrow``: the 0.6B shape's 28 layers, norms, GQA ratio and 151,936-entry vocabulary at
width 64), and runs the trainer's order of passes: each step the rollout's weight sync (``iter_full_weights``), the
old-log-prob pass, the update. Two steps of warm-up, then per pass the collectives of steps 3 and 4 (op, calls,
elements: each rank's input; :func:`repro.collectives_trace.trace_collectives`), the host operators of step 5 by
issuer (:func:`repro.bench.host_ops.host_ops`) and the Python calls of step 6 (cProfile; DeepSpeed's apart).

Cases: ``zero2``; ``zero3`` with every weight smaller than the embedding kept whole on each rank
(``stage3_param_persistence_threshold``, default one element below the embedding's, which at width 1,024 keeps the
same 309 weights whole as 1e7) and torch's linear, the worker benchmark's fastest ZeRO-3; ``zero3_hooked``, the same
with DeepSpeed's hooks on every module; ``zero3_stock``, DeepSpeed's own sizes. The batch is the GPU run's by default
(128 samples a rank, 12-token prompts, 8-10-token responses; :func:`repro.bench.rmpad.make_batch`). It found the weight sync releasing every whole
parameter at ZeRO-3 (``results/seed_scale/README.md`` section 10)::

    python -m repro.bench.step_counts --out results/seed_scale/raw/s29_cpu
    python -m repro.bench.step_counts --table results/seed_scale/raw/s29_cpu/*.json
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from repro.bench.rmpad import make_batch
from repro.bench.shapes import make_model_dir, model_config

PASSES = ("weight_sync", "old_log_prob", "update")
_DS = "actor_rollout_ref.actor.deepspeed"
CASES = {
    "zero2": [f"{_DS}.zero_stage=2"],
    "zero3": [f"{_DS}.zero_stage=3", f"{_DS}.stage3_param_persistence_threshold={{persist}}",
              f"{_DS}.memory_efficient_linear=false"],
    "zero3_hooked": [f"{_DS}.zero_stage=3", f"{_DS}.stage3_param_persistence_threshold={{persist}}",
                     f"{_DS}.memory_efficient_linear=false", f"{_DS}.zero3_unhook_persistent_modules=false"],
    "zero3_stock": [f"{_DS}.zero_stage=3"],
}


def whole_below_embedding(shape: str) -> int:
    """The persistence threshold that keeps every weight of ``shape`` smaller than its embedding whole."""
    config = model_config(shape)
    return config.vocab_size * config.hidden_size - 1


def collectives(trace_dir: str, rank: int) -> dict:
    """This rank's traced calls by op (calls, elements) and by call site."""
    from repro.collectives_trace import load_traces

    # a pass with no collective leaves no trace file (ZeRO-2's weight sync)
    calls = load_traces(trace_dir)[rank].calls if any(Path(trace_dir).glob("rank*.jsonl")) else []
    ops, numel = Counter(c.op for c in calls), Counter()
    for c in calls:
        numel[c.op] += c.numel
    return {"by_op": {op: [ops[op], numel[op]] for op in sorted(ops)},
            "sites": dict(Counter(f"{c.op} {c.numel} {c.site} | {c.lib_site}" for c in calls))}


def python_calls(call) -> dict:
    """Python calls (builtins included) of one ``call()`` under cProfile, DeepSpeed's apart, its 12 most called."""
    prof = cProfile.Profile()
    prof.enable()
    call()
    prof.disable()
    stats, deepspeed = pstats.Stats(prof).stats, Counter()
    for (path, line, name), (_, ncalls, *_rest) in stats.items():
        if "deepspeed" in path:
            deepspeed[f"{Path(path).name}:{line}:{name}"] += ncalls
    return {"python_calls": sum(v[1] for v in stats.values()), "deepspeed_calls": sum(deepspeed.values()),
            "deepspeed_top": dict(deepspeed.most_common(12))}


def count_passes(overrides: list[str], config_name: str, batch_args: tuple[int, int, int, int]) -> dict:
    """Every count of :data:`PASSES` on this rank, in the trainer's order (the process group must exist or be
    startable from the environment; every rank calls it)."""
    import torch.distributed as dist

    from repro.bench.host_ops import host_ops
    from repro.cluster.process_group import init_distributed
    from repro.collectives_trace import trace_collectives
    from repro.config.loader import load_config
    from repro.workers.actor import ActorWorker

    init_distributed()
    rank = dist.get_rank()
    cfg = load_config(["trainer.device=cpu", "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.mode=sync",
                       *overrides], config_name=config_name)
    worker = ActorWorker(cfg)
    samples, prompt, response, min_response = batch_args
    # the seed run's batch: prompts all of one length (no left padding), responses of uniform lengths
    data = make_batch(argparse.Namespace(micro=samples, gas=1, prompt=prompt, response=response,
                                         min_response=min_response), worker.engine.module.config.vocab_size,
                      min_prompt=prompt)
    calls = {"weight_sync": lambda: sum(t.numel() for _, t in worker.iter_full_weights()),
             "old_log_prob": lambda: worker.compute_log_prob(data, calculate_entropy=True),
             "update": lambda: worker.update_policy(data)}
    row: dict = {"report": {k: v for k, v in worker.engine.report().items() if "zero" in k or k == "stage"}}
    for _ in range(2):
        for call in calls.values():
            call()
    traced: dict[str, list] = {name: [] for name in PASSES}
    for _ in range(2):
        for name in PASSES:
            with tempfile.TemporaryDirectory() as trace_dir:
                with trace_collectives(trace_dir, check="off"):
                    calls[name]()
                dist.barrier()
                traced[name].append(collectives(trace_dir, rank))
    ops = {name: host_ops(calls[name]) for name in PASSES}
    profiled = {name: python_calls(calls[name]) for name in PASSES}
    for name in PASSES:
        row[name] = {"collectives_step3": traced[name][0], "collectives_step4": traced[name][1],
                     "host_ops": ops[name]["host_ops"], "host_ops_by": ops[name]["host_ops_by"],
                     "host_ops_top": ops[name]["host_ops_top"], **profiled[name]}
    return row


def table(paths: list[str]) -> str:
    """One markdown row per (result file, pass): the step-4 collectives, the host operators and Python calls."""
    lines = ["| run | pass | collectives (step 4): op x calls (elements) | host ops | of them DeepSpeed's | Python calls "
             "| of them DeepSpeed's |", "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for path in paths:
        row = json.loads(Path(path).read_text())
        for name in PASSES:
            x = row[name]
            ops = ", ".join(f"{op} x{n} ({numel:,})" for op, (n, numel) in x["collectives_step4"]["by_op"].items()
                            if op != "wait") or "none"
            lines.append(f"| {Path(path).parent.name}/{row['case']} | {name} | {ops} | {x['host_ops']:,} | "
                         f"{x['host_ops_by'].get('deepspeed', 0):,} | {x['python_calls']:,} | {x['deepspeed_calls']:,} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m repro.bench.step_counts", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="grpo_0p6b", help="the preset whose actor runs (its batch split)")
    parser.add_argument("--shape", default="qwen3-0.6b-narrow", help="a bench shape (repro.bench.shapes)")
    parser.add_argument("--cases", default="zero2,zero3,zero3_hooked", help=f"comma-separated subset of {list(CASES)}")
    parser.add_argument("--persist", type=int, default=None,
                        help="ZeRO-3's persistence threshold (default: every weight smaller than the embedding whole)")
    parser.add_argument("--samples", type=int, default=128, help="samples a rank")
    parser.add_argument("--prompt", type=int, default=12)
    parser.add_argument("--response", type=int, default=10)
    parser.add_argument("--min-response", type=int, default=8)
    parser.add_argument("--out", help="folder for each case's JSON and its ranks' logs (default: a new temporary one)")
    parser.add_argument("--table", nargs="+", metavar="JSON", help="print the table of these result files; run nothing")
    parser.add_argument("--child", nargs=3, metavar=("CASE", "MODEL_DIR", "RESULT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    unknown = sorted(set(args.cases.split(",")) - set(CASES))
    if unknown:
        parser.error(f"--cases: {unknown} are not cases; choose from {list(CASES)}")
    persist = args.persist if args.persist is not None else whole_below_embedding(args.shape)
    batch_args = (args.samples, args.prompt, args.response, args.min_response)
    if args.child:
        case, model_dir, result = args.child
        overrides = [f"actor_rollout_ref.model.path={model_dir}", *(o.format(persist=persist) for o in CASES[case])]
        row = {"case": case, **count_passes(overrides, args.config, batch_args)}
        if int(os.environ.get("RANK", "0")) == 0:
            Path(result).write_text(json.dumps(row, indent=1, default=str))
        return 0
    from repro.collectives.launch.launcher import free_port

    out = Path(args.out or tempfile.mkdtemp(prefix="step_counts_"))
    out.mkdir(parents=True, exist_ok=True)
    model_dir = make_model_dir(args.shape, Path(tempfile.gettempdir()) / f"repro_step_counts_{args.shape}")
    forwarded = ["--config", args.config, "--shape", args.shape, "--persist", str(persist), "--samples",
                 str(args.samples), "--prompt", str(args.prompt), "--response", str(args.response), "--min-response",
                 str(args.min_response)]
    results = []
    for case in args.cases.split(","):
        port, procs = str(free_port()), []
        for rank in range(2):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
            with open(out / f"{case}_rank{rank}.log", "w") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "repro.bench.step_counts", *forwarded, "--child", case, str(model_dir),
                     str(out / f"{case}.json")], env=env, stdout=log, stderr=subprocess.STDOUT))
        codes = [p.wait() for p in procs]
        if any(codes):
            print(f"step_counts: case {case} failed (exit {codes}); see {out}/{case}_rank*.log", file=sys.stderr)
            return 1
        results.append(str(out / f"{case}.json"))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
