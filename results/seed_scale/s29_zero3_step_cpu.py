"""Issue 35, session 29: what ZeRO-3 adds to the seed-scale GRPO step's two actor passes, counted on 2 CPU gloo ranks.

Section 9 of this folder's README measured ZeRO-3 (the worker benchmark's fastest settings) at 0.77-0.85x of ZeRO-2 on
the update and 1.8-2.9x slower on the old log-prob pass of ``-cn grpo_0p6b`` (2 H200s), not profiled. No GPU was lent
this session; this counts, on CPU, what the host does and which collectives run in those two passes, which depends
on the model's structure and the batch split, not on the machine: ``repro.workers.actor.ActorWorker`` built from the
preset itself (``repro.config.load_config("grpo_0p6b")``: remove-padding, token budgets, checkpointing, its actor
batch split) on 2 ranks, with the 0.6B shape's 28 layers, norms, GQA ratio and 151,936-entry vocabulary at width 64
(``qwen3-0.6b-narrow``), on the step's batch: 128 samples a rank, 12-token prompts, 8-10-token responses (the GPU
run's ``prompt_length`` and ``response_length``). ZeRO-3 keeps whole what section 9's runs kept whole: the layers'
weights (persistence threshold scaled with the width: 1e7 at width 1,024, 1e6 here), the embedding sharded.

Per pass, in the trainer's order (each step the rollout's weight sync, the old-log-prob pass, then the update; two steps of warm-up, collectives of
steps 3 and 4, host operators of step 5, cProfile of step 6): collectives by op (count, elements; repro's tracer),
host operators by issuer (:func:`repro.bench.host_ops.host_ops`), and Python calls that would wait for a GPU
(``synchronize``, events, ``item``/``tolist``) and DeepSpeed's heaviest functions by call count, from cProfile::

    python results/seed_scale/s29_zero3_step_cpu.py --out results/seed_scale/raw/s29_cpu
    python results/seed_scale/s29_zero3_step_cpu.py --table results/seed_scale/raw/s29_cpu*/*.json
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

CASES = {
    "zero2": ["actor_rollout_ref.actor.deepspeed.zero_stage=2"],
    "zero3": ["actor_rollout_ref.actor.deepspeed.zero_stage=3",
              "actor_rollout_ref.actor.deepspeed.stage3_param_persistence_threshold=1000000",
              "actor_rollout_ref.actor.deepspeed.memory_efficient_linear=false"],
    "zero3_hooked": ["actor_rollout_ref.actor.deepspeed.zero_stage=3",
                     "actor_rollout_ref.actor.deepspeed.stage3_param_persistence_threshold=1000000",
                     "actor_rollout_ref.actor.deepspeed.memory_efficient_linear=false",
                     "actor_rollout_ref.actor.deepspeed.zero3_unhook_persistent_modules=false"],
}
# Names of Python functions that wait for a GPU where one runs (on CPU they return at once, but are still called).
WAITS = ("synchronize", "wait_stream", "wait_event", "item", "tolist", "cpu", "record_event", "query")


def batch(vocab: int, rank: int, samples: int = 128, prompt: int = 12, response: int = 10):
    import torch

    gen = torch.Generator().manual_seed(rank)
    r_lens = torch.randint(8, response + 1, (samples,), generator=gen)
    response_mask = torch.arange(response)[None] < r_lens[:, None]
    attention_mask = torch.cat([torch.ones(samples, prompt, dtype=torch.bool), response_mask], dim=1).long()
    input_ids = torch.randint(3, vocab, (samples, prompt + response), generator=gen) * attention_mask
    return {
        "input_ids": input_ids, "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        "responses": input_ids[:, prompt:].clone(), "response_mask": response_mask.long(),
        "old_log_probs": -torch.rand(samples, response, generator=gen) * 5 * response_mask,
        "advantages": torch.randn(samples, response, generator=gen) * response_mask,
    }


def _collectives(trace_dir: str, rank: int) -> dict:
    from repro.collectives_trace import load_traces

    # a pass with no collective leaves no trace file (ZeRO-2's weight sync)
    calls = load_traces(trace_dir)[rank].calls if any(Path(trace_dir).glob("rank*.jsonl")) else []
    ops = Counter(c.op for c in calls)
    numel = Counter()
    for c in calls:
        numel[c.op] += c.numel
    sites = Counter(f"{c.op} {c.numel} {c.site} | {c.lib_site}" for c in calls)
    return {"calls": len(calls), "by_op": {op: [ops[op], numel[op]] for op in sorted(ops)}, "sites": dict(sites),
            "largest": sorted({(c.op, c.numel) for c in calls}, key=lambda x: -x[1])[:4]}


def _profiled(call) -> dict:
    prof = cProfile.Profile()
    prof.enable()
    call()
    prof.disable()
    stats = pstats.Stats(prof).stats
    waits, deepspeed = Counter(), Counter()
    for (path, line, name), (_, ncalls, *_rest) in stats.items():
        # cProfile names a C method ``<method 'item' of ...>`` under the path ``~``
        if name in WAITS or (path == "~" and any(f"'{w}'" in name for w in WAITS)):
            waits[f"{name} ({Path(path).name}:{line})"] += ncalls
        if "deepspeed" in path:
            deepspeed[f"{Path(path).name}:{line}:{name}"] += ncalls
    return {"python_calls": sum(v[1] for v in stats.values()), "waits": dict(waits.most_common(12)),
            "deepspeed_calls": sum(deepspeed.values()), "deepspeed_top": dict(deepspeed.most_common(12))}


def child(case: str, model_dir: str, result: str) -> None:
    import torch.distributed as dist

    from repro.bench.host_ops import host_ops
    from repro.cluster.process_group import init_distributed
    from repro.collectives_trace import trace_collectives
    from repro.config.loader import load_config
    from repro.workers.actor import ActorWorker

    init_distributed()
    rank = dist.get_rank()
    cfg = load_config([f"actor_rollout_ref.model.path={model_dir}", "trainer.device=cpu",
                       "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.mode=sync", *CASES[case]],
                      config_name="grpo_0p6b")
    worker = ActorWorker(cfg)
    data = batch(worker.engine.module.config.vocab_size, rank)
    # The rollout's weight sync consumes the actor's full weights (collective at ZeRO-3), then the two actor passes.
    passes = {"weight_sync": lambda: sum(t.numel() for _, t in worker.iter_full_weights()),
              "old_log_prob": lambda: worker.compute_log_prob(data, calculate_entropy=True),
              "update": lambda: worker.update_policy(data)}
    row = {"case": case, "report": {k: v for k, v in worker.engine.report().items() if "zero" in k or "param" in k}}
    # The trainer's order: each step the weight sync, the old-log-prob pass, then the update. Two steps of warm-up, then each pass of
    # steps 3 and 4 traced on its own, step 5's counted by the profiler, step 6's under cProfile.
    for _ in range(2):
        for call in passes.values():
            call()
    traced = {name: [] for name in passes}
    for _ in range(2):
        for name, call in passes.items():
            with tempfile.TemporaryDirectory() as trace_dir:
                with trace_collectives(trace_dir, check="off"):
                    call()
                dist.barrier()
                traced[name].append(_collectives(trace_dir, rank))
    ops = {name: host_ops(call) for name, call in passes.items()}
    profiled = {name: _profiled(call) for name, call in passes.items()}
    for name in passes:
        row[name] = {"collectives_step3": traced[name][0], "collectives_step4": traced[name][1],
                     "host_ops": ops[name]["host_ops"], "host_ops_by": ops[name]["host_ops_by"],
                     "host_ops_top": ops[name]["host_ops_top"], **profiled[name]}
    if rank == 0:
        Path(result).write_text(json.dumps(row, indent=1, default=str))
    dist.barrier()


def table(paths: list[str]) -> str:
    """One markdown row per (result file, pass): the step-4 collectives, the host operators and Python calls."""
    lines = ["| run | pass | collectives (step 4): op x calls (elements) | host ops | of them DeepSpeed's | Python calls "
             "| of them DeepSpeed's |", "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for path in paths:
        row = json.loads(Path(path).read_text())
        for name in ("weight_sync", "old_log_prob", "update"):
            x = row[name]
            ops = ", ".join(f"{op} x{n} ({numel:,})" for op, (n, numel) in x["collectives_step4"]["by_op"].items()
                            if op != "wait") or "none"
            lines.append(f"| {Path(path).parent.name}/{row['case']} | {name} | {ops} | {x['host_ops']:,} | "
                         f"{x['host_ops_by'].get('deepspeed', 0):,} | {x['python_calls']:,} | {x['deepspeed_calls']:,} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--table", nargs="+", metavar="JSON", help="print the table of these result files; run nothing")
    args, _ = parser.parse_known_args()
    if args.table:
        return print(table(args.table))
    if args.child:
        return child(*args.child)
    from repro.bench.shapes import make_model_dir
    from repro.collectives.launch.launcher import free_port

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = make_model_dir("qwen3-0.6b-narrow", Path(tempfile.gettempdir()) / "repro_s29_narrow")
    for case in args.cases.split(","):
        port, procs = str(free_port()), []
        for rank in range(2):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
            log = open(out / f"{case}_rank{rank}.log", "w")
            procs.append(subprocess.Popen([sys.executable, __file__, "--out", str(out), "--child", case,
                                           str(model_dir), str(out / f"{case}.json")],
                                          env=env, stdout=log, stderr=subprocess.STDOUT))
        codes = [p.wait() for p in procs]
        print(f"{case}: exit {codes}", flush=True)


if __name__ == "__main__":
    main()
