"""``python -m repro.bench.peers``: one GPU, one command, repro's GRPO step beside verl's and TRL's.

Every peer trains the same warm-started tiny policy on the same arithmetic prompts (verl's parquet
schema) in the ``grpo_tiny`` recipe: 32 prompts x 8 samples, 12 new tokens, lr 1e-4, 2 epochs x 2
mini-batches, clip 0.2, no KL, vLLM rollout at 0.3 of the GPU's memory, enforce-eager. Peers:

- ``repro-zero2`` / ``repro-zero3``: repro's own trainer (``python -m repro.main_ppo -cn grpo_tiny``),
  DeepSpeed ZeRO-2, or ZeRO-3 with the decoder layers as leaf modules, torch AdamW;
- ``verl-dp`` / ``verl-deepspeed``: verl's trainer (``repro.integrations.verl.e2e``) with its FSDP
  engine, or with repro's DeepSpeed engine at ZeRO-2;
- ``trl``: TRL's ``GRPOTrainer``, DeepSpeed ZeRO-2, vLLM colocate (``repro.integrations.trl.peer``),
  run with ``--trl-pythonpath`` ahead of the rest (TRL lives in its own wheels).

Each peer runs in its own process (none shares a CUDA context or a Ray cluster with another) and
writes ``<out>/<peer>/metrics.tsv`` in verl's metric names. The table (``table.md``,
``peers.json``) gives, over the steps after the first (start-up and compilation excluded), the
median s/step and its split (generation / update / weight sync), tokens/s/GPU (verl's definition:
prompt + response tokens / step time / GPUs), peak allocated memory, and the mean score of step 1
and of the last 5 steps; peers that an earlier call measured into the same ``--out`` join it.
``--print-commands`` prints the commands without running them.
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

from repro.config.presets import samples_per_mini_batch
from repro.rl.metrics import MetricsLog

PEERS = ("repro-zero2", "repro-zero3", "verl-dp", "verl-deepspeed", "trl")
SPLIT = ("timing_s/step", "timing_s/gen", "timing_s/update_actor", "timing_s/update_weights", "timing_s/old_log_prob")
MEMORY = ("perf/max_memory_allocated_gb", "actor/perf/max_memory_allocated_gb")
SCORE, TAIL = "critic/score/mean", 5
UTIL = 0.3  # vLLM's gpu_memory_utilization: the verl e2e recipe's, so every peer gets the same
MINI_BATCH = samples_per_mini_batch("grpo_tiny")  # 16 prompts x 8; a micro-batch divides it
# Activation checkpointing off for every peer, stated: verl's model config turns it on by default
# (repro's and TRL's leave it off), and at this size it only adds a second forward.
NO_CHECKPOINTING = "actor_rollout_ref.model.enable_gradient_checkpointing=False"


def commands(peer: str, steps: int, policy: Path, train: Path, val: Path, run_dir: Path,
             micro: int = MINI_BATCH, vllm_sleep: bool = False) -> list[str]:
    """The command line that runs ``peer`` for ``steps`` rollout steps into ``run_dir``, every peer
    with ``micro`` samples per update micro-batch and vLLM's sleep mode on or off alike."""
    py = sys.executable
    if peer.startswith("repro-"):
        stage = peer.removeprefix("repro-zero")
        return [py, "-m", "repro.main_ppo", "-cn", "grpo_tiny", f"actor_rollout_ref.model.path={policy}",
                f"data.train_files={train}", f"data.val_files={val}", "trainer.device=cuda",
                "trainer.n_gpus_per_node=1", f"trainer.total_training_steps={steps}", "trainer.test_freq=-1",
                "trainer.val_before_train=False", "trainer.save_freq=-1", f"trainer.output_dir={run_dir}",
                "trainer.progress=plain", "actor_rollout_ref.rollout.name=vllm",
                f"actor_rollout_ref.rollout.gpu_memory_utilization={UTIL}",
                "actor_rollout_ref.rollout.enforce_eager=True", f"actor_rollout_ref.actor.deepspeed.zero_stage={stage}",
                "actor_rollout_ref.actor.deepspeed.torch_adam=True",
                f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
                f"actor_rollout_ref.rollout.free_cache_engine={vllm_sleep}", NO_CHECKPOINTING]
    if peer.startswith("verl-"):
        engine = peer.removeprefix("verl-")
        return [py, "-m", "repro.integrations.verl.e2e", "--engine", engine, "--steps", str(steps),
                "--out", str(run_dir.parent / "verl_runs"), "--micro", str(micro), _sleep_flag(vllm_sleep),
                NO_CHECKPOINTING]  # e2e hands keys it does not know to verl's trainer
    return [py, "-m", "repro.integrations.trl.peer", "--policy", str(policy), "--train", str(train),
            "--steps", str(steps), "--out", str(run_dir), "--util", str(UTIL), "--micro", str(micro),
            _sleep_flag(vllm_sleep)]


def _sleep_flag(on: bool) -> str:
    return "--vllm-sleep" if on else "--no-vllm-sleep"


def summarize(rows: list[dict[str, float]], gpus: int = 1) -> dict[str, float]:
    """Medians over the steps after the first, the scores of step 1 and of the last ``TAIL`` steps."""
    later = rows[1:] or rows
    out: dict[str, float] = {"steps": len(rows)}
    for key in SPLIT:
        values = [r[key] for r in later if key in r]
        if values:
            out[key] = statistics.median(values)
    tps = [r["perf/total_num_tokens"] / r["timing_s/step"] / gpus for r in later
           if "perf/total_num_tokens" in r and r.get("timing_s/step")]
    if tps:
        out["tokens_per_s_per_gpu"] = statistics.median(tps)
    memory = [r[k] for r in rows for k in MEMORY if k in r]
    if memory:
        out["max_memory_allocated_gb"] = max(memory)
    scores = [r[SCORE] for r in rows]
    out["score_step1"] = scores[0]
    out[f"score_last{TAIL}"] = sum(scores[-TAIL:]) / len(scores[-TAIL:])
    return out


def table(results: dict[str, dict[str, float]]) -> str:
    cols = [("s/step", "timing_s/step"), ("gen s", "timing_s/gen"), ("update s", "timing_s/update_actor"),
            ("sync s", "timing_s/update_weights"), ("old log-prob s", "timing_s/old_log_prob"),
            ("tokens/s/GPU", "tokens_per_s_per_gpu"), ("max alloc GB", "max_memory_allocated_gb"),
            ("score step 1", "score_step1"), (f"score last {TAIL}", f"score_last{TAIL}")]
    fastest = min((r["timing_s/step"] for r in results.values() if "timing_s/step" in r), default=None)
    lines = ["| peer | steps | " + " | ".join(c for c, _ in cols) + " | s/step vs fastest |",
             "| --- | --- | " + " | ".join("---" for _ in cols) + " | --- |"]
    for peer, r in results.items():
        if "error" in r:
            lines.append(f"| {peer} | failed: {r['error']} |")
            continue
        cells = [f"{r[k]:.3g}" if k in r else "-" for _, k in cols]
        ratio = f"{r['timing_s/step'] / fastest:.2f}x" if fastest and "timing_s/step" in r else "-"
        lines.append(f"| {peer} | {int(r['steps'])} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines) + "\n"


def _metrics_file(peer: str, run_dir: Path) -> Path:
    if peer.startswith("verl-"):
        # repro.integrations.verl.e2e names its run folders by engine (ZeRO-2 for deepspeed).
        name = "dp" if peer == "verl-dp" else "deepspeed-zero2"
        return run_dir.parent / "verl_runs" / name / "metrics.tsv"
    return run_dir / "metrics.tsv"


def _measured(peer: str, run_dir: Path) -> list[dict[str, float]]:
    """The rows of ``peer``'s ``metrics.tsv`` (none when it did not get to a step)."""
    return MetricsLog(_metrics_file(peer, run_dir)).rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m repro.bench.peers", description=__doc__.split("\n")[0])
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, from {list(PEERS)}")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", type=Path, default=Path("outputs/peers"))
    p.add_argument("--timeout", type=float, default=560.0, help="seconds per peer")
    p.add_argument("--trl-pythonpath", default="", help="prepended to PYTHONPATH for the trl peer only")
    p.add_argument("--micro", type=int, default=MINI_BATCH,
                   help=f"samples per update micro-batch, every peer alike; divides {MINI_BATCH} (default: one a mini-batch)")
    p.add_argument("--vllm-sleep", action=argparse.BooleanOptionalAction, default=False,
                   help="vLLM sleep mode between generations, every peer alike (default off: TRL's default)")
    p.add_argument("--print-commands", action="store_true")
    args = p.parse_args(argv)
    peers = [x for x in args.peers.split(",") if x]
    bad = [x for x in peers if x not in PEERS]
    if bad or not peers or args.steps < 2:
        print(f"--peers {bad or peers}: choose from {list(PEERS)}; --steps must be >= 2", file=sys.stderr)
        return 2
    if args.micro < 1 or MINI_BATCH % args.micro:
        print(f"--micro {args.micro}: must divide the recipe's mini-batch of {MINI_BATCH} samples", file=sys.stderr)
        return 2
    from repro.data.arith import ensure_arith_parquet
    from repro.data.sft import cache_root, ensure_tiny_policy

    args.out.mkdir(parents=True, exist_ok=True)
    train, val = ensure_arith_parquet(cache_root() / "arith")
    policy = Path("tiny") if args.print_commands else ensure_tiny_policy()
    results: dict[str, dict[str, float]] = {}
    for peer in peers:
        run_dir = args.out / peer
        cmd = commands(peer, args.steps, policy, train, val, run_dir, args.micro, args.vllm_sleep)
        if args.print_commands:
            print(" ".join(cmd))
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "command.txt").write_text(" ".join(cmd) + "\n")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if peer == "trl" and args.trl_pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(x for x in (args.trl_pythonpath, env.get("PYTHONPATH", "")) if x)
        t0 = time.time()
        try:
            with open(run_dir / "console.log", "w") as log:
                rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        rows = _measured(peer, run_dir)
        if rows:
            results[peer] = summarize(rows) | {"wall_s": time.time() - t0, "exit": rc}
        else:
            results[peer] = {"error": f"exit {rc}, no metrics (log {run_dir / 'console.log'})"}
        print(json.dumps({"peer": peer, **results[peer]}), flush=True)
    if args.print_commands:
        return 0
    # Peers measured by earlier calls into the same --out join the table (a 10-minute command limit
    # may split the peers over several calls on one machine); peers.json says when their runs ended.
    for peer in PEERS:
        if peer not in results and (rows := _measured(peer, args.out / peer)):
            ended = time.gmtime(_metrics_file(peer, args.out / peer).stat().st_mtime)
            results[peer] = summarize(rows) | {"earlier_call_ended": time.strftime("%Y-%m-%dT%H:%M:%SZ", ended)}
    results = {peer: results[peer] for peer in PEERS if peer in results}
    import torch

    head = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join(["python -m repro.bench.peers", *(argv if argv is not None else sys.argv[1:])])}
    (args.out / "peers.json").write_text(json.dumps({**head, "peers": results}, indent=1) + "\n")
    (args.out / "table.md").write_text(f"{head['device']}, {head['date']}\n\n    {head['command']}\n\n" + table(results))
    print(table(results))
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
