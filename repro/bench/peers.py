"""``python -m repro.bench.peers``: one command, repro's GRPO step beside verl's and TRL's.

Every peer trains the same built-in policy on the same arithmetic prompts (verl's parquet schema)
with the settings of one peer recipe (``repro.config.peer_recipes``, ``--recipe``): ``tiny`` (the
``grpo_tiny`` preset, the 1 M-parameter policy, one GPU) or ``seed`` (``grpo_0p6b``, the
Qwen3-0.6B-shaped policy, two GPUs, dp=2). Peers:

- ``repro-zero2`` / ``repro-zero3``: repro's own trainer (``python -m repro.main_ppo -cn <preset>``),
  DeepSpeed ZeRO-2, or ZeRO-3 with the decoder layers as leaf modules;
- ``verl-dp`` / ``verl-deepspeed`` / ``verl-deepspeed-zero3``: verl's trainer (``repro.integrations.verl.e2e``)
  with its FSDP2 engine, or with repro's DeepSpeed engine at ZeRO-2 or ZeRO-3;
- ``trl``: TRL's ``GRPOTrainer``, DeepSpeed ZeRO-2, vLLM colocate (``repro.integrations.trl.peer``, under
  ``torchrun`` on several GPUs), run with ``--trl-pythonpath`` ahead of the rest (TRL lives in its own wheels).

Each peer runs in its own process (none shares a CUDA context or a Ray cluster with another) and
writes ``<out>/<peer>/metrics.tsv`` in verl's metric names. The table (``table.md``,
``peers.json``) gives, over the steps after the first (start-up and compilation excluded), the
median s/step and its split (generation / update / weight sync), tokens/s/GPU (verl's definition:
prompt + response tokens / step time / GPUs), the peak memory each peer's processes held on a GPU as
the driver saw it (NVML, sampled every 0.2 s: measured the same way for every peer, vLLM included
wherever it runs), each peer's own peak allocated figure, and the mean score of step 1 and of the
last 5 steps; peers that an earlier call measured into the same ``--out`` join it (``--collect``
writes the table from them alone). ``--print-commands`` prints the commands without running them.
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

from repro.config.peer_recipes import RECIPES, recipe
from repro.devices import NvmlPeak
from repro.rl.metrics import MetricsLog

PEERS = ("repro-zero2", "repro-zero3", "verl-dp", "verl-deepspeed", "verl-deepspeed-zero3", "trl")
SPLIT = ("timing_s/step", "timing_s/gen", "timing_s/update_actor", "timing_s/update_weights", "timing_s/old_log_prob")
MEMORY = ("perf/max_memory_allocated_gb", "actor/perf/max_memory_allocated_gb")
SCORE, TAIL = "critic/score/mean", 5
VERL_RUN = {"verl-dp": ("dp", 2), "verl-deepspeed": ("deepspeed", 2), "verl-deepspeed-zero3": ("deepspeed", 3)}
"""verl peer -> (``model_engine``, ZeRO stage of repro's engine)."""


def commands(peer: str, steps: int, policy: Path, train: Path, val: Path, run_dir: Path,
             micro: int | None = None, vllm_sleep: bool | None = None, recipe_name: str = "tiny") -> list[str]:
    """The command line that runs ``peer`` for ``steps`` rollout steps into ``run_dir`` in recipe
    ``recipe_name``, every peer with ``micro`` samples per update micro-batch and vLLM's sleep mode on
    or off alike (both default to the recipe's)."""
    r = recipe(recipe_name)
    micro = r.micro if micro is None else micro
    vllm_sleep = r.vllm_sleep if vllm_sleep is None else vllm_sleep
    py = sys.executable
    if peer.startswith("repro-"):
        stage = peer.removeprefix("repro-zero")
        return [py, "-m", "repro.main_ppo", "-cn", r.preset, *r.overrides, f"actor_rollout_ref.model.path={policy}",
                f"data.train_files={train}", f"data.val_files={val}", "trainer.device=cuda",
                f"trainer.total_training_steps={steps}", f"trainer.output_dir={run_dir}", "trainer.progress=plain",
                f"actor_rollout_ref.actor.deepspeed.zero_stage={stage}",
                f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
                f"actor_rollout_ref.rollout.free_cache_engine={vllm_sleep}"]
    if peer in VERL_RUN:
        engine, stage = VERL_RUN[peer]
        return [py, "-m", "repro.integrations.verl.e2e", "--engine", engine, "--zero-stage", str(stage),
                "--recipe", r.name, "--steps", str(steps), "--run-dir", str(run_dir),
                "--micro", str(micro), _sleep_flag(vllm_sleep)]
    launcher = [py, "-m", "torch.distributed.run", "--nproc-per-node", str(r.gpus), "--master-port", "29531"] \
        if r.gpus > 1 else [py]
    return [*launcher, "-m", "repro.integrations.trl.peer", "--recipe", r.name, "--policy", str(policy),
            "--train", str(train), "--steps", str(steps), "--out", str(run_dir), "--micro", str(micro),
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
            ("tokens/s/GPU", "tokens_per_s_per_gpu"), ("peak GPU GB (NVML)", "nvml_peak_gb"),
            ("own max alloc GB", "max_memory_allocated_gb"),
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


def _measured(run_dir: Path) -> list[dict[str, float]]:
    """The rows of a peer's ``metrics.tsv`` (none when it did not get to a step)."""
    return MetricsLog(run_dir / "metrics.tsv").rows


def _run(peer: str, cmd: list[str], run_dir: Path, timeout: float, trl_pythonpath: str, gpus: int) -> dict:
    """Run one peer; its summary, also left in ``<run_dir>/peer.json`` for later calls' tables."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.tsv").unlink(missing_ok=True)  # an earlier run's rows must not pass for this one's
    (run_dir / "command.txt").write_text(" ".join(cmd) + "\n")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if peer == "trl" and trl_pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(x for x in (trl_pythonpath, env.get("PYTHONPATH", "")) if x)
    t0 = time.time()
    with NvmlPeak() as memory, open(run_dir / "console.log", "w") as log:
        # A session of its own, so a timeout stops the peer's whole process tree (Ray, vLLM, torchrun's ranks).
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: int | str = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
            rc = "timeout"
    rows = _measured(run_dir)
    if not rows:
        result: dict = {"error": f"exit {rc}, no metrics (log {run_dir / 'console.log'})"}
    else:
        result = summarize(rows, gpus) | {"wall_s": time.time() - t0, "exit": rc}
        if memory.peak_gb:
            result["nvml_peak_gb"] = memory.peak_gb
    result["ended"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (run_dir / "peer.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m repro.bench.peers", description=__doc__.split("\n")[0])
    p.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, from {list(PEERS)}")
    p.add_argument("--recipe", choices=sorted(RECIPES), default="tiny",
                   help="the settings every peer gets (repro.config.peer_recipes): tiny (1 GPU) or seed (0.6B, 2 GPUs)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out", type=Path, default=Path("outputs/peers"))
    p.add_argument("--timeout", type=float, default=560.0, help="seconds per peer")
    p.add_argument("--trl-pythonpath", default="", help="prepended to PYTHONPATH for the trl peer only")
    p.add_argument("--micro", type=int, default=None,
                   help="samples per update micro-batch on one GPU, every peer alike (default: the recipe's)")
    p.add_argument("--vllm-sleep", action=argparse.BooleanOptionalAction, default=None,
                   help="vLLM sleep mode between generations, every peer alike (default: the recipe's)")
    p.add_argument("--print-commands", action="store_true")
    p.add_argument("--collect", action="store_true", help="write the table of the peers already under --out; no run")
    args = p.parse_args(argv)
    r = recipe(args.recipe)
    peers = [] if args.collect else [x for x in args.peers.split(",") if x]
    bad = [x for x in peers if x not in PEERS]
    if bad or (not peers and not args.collect) or args.steps < 2:
        print(f"--peers {bad or peers}: choose from {list(PEERS)}; --steps must be >= 2", file=sys.stderr)
        return 2
    mini = r.mini_batch_per_gpu()
    if args.micro is not None and (args.micro < 1 or mini % args.micro):
        print(f"--micro {args.micro}: must divide the recipe's mini-batch of {mini} samples a GPU", file=sys.stderr)
        return 2
    results: dict[str, dict] = {}
    if peers:
        from repro.data.arith import ensure_arith_parquet
        from repro.data.policies import built_in
        from repro.data.sft import cache_root

        args.out.mkdir(parents=True, exist_ok=True)
        train, val = ensure_arith_parquet(cache_root() / "arith")
        policy = Path(r.policy) if args.print_commands else built_in(r.policy).ensure()
    for peer in peers:
        cmd = commands(peer, args.steps, policy, train, val, args.out / peer, args.micro, args.vllm_sleep, r.name)
        if args.print_commands:
            print(" ".join(cmd))
            continue
        results[peer] = _run(peer, cmd, args.out / peer, args.timeout, args.trl_pythonpath, r.gpus)
        print(json.dumps({"peer": peer, **results[peer]}), flush=True)
    if args.print_commands:
        return 0
    # Peers measured by earlier calls into the same --out join the table (a 10-minute command limit
    # may split the peers over several calls on one machine); each says when its run ended.
    for peer in PEERS:
        if peer not in results and (args.out / peer / "peer.json").is_file():
            results[peer] = json.loads((args.out / peer / "peer.json").read_text())
    results = {peer: results[peer] for peer in PEERS if peer in results}
    import torch

    head = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "recipe": r.name, "gpus": r.gpus,
            "command": " ".join(["python -m repro.bench.peers", *(argv if argv is not None else sys.argv[1:])])}
    (args.out / "peers.json").write_text(json.dumps({**head, "peers": results}, indent=1) + "\n")
    (args.out / "table.md").write_text(f"{head['device']}, {head['date']}, recipe {r.name} on {r.gpus} GPU(s)\n\n"
                                       f"    {head['command']}\n\n" + table(results))
    print(table(results))
    return 0 if all("error" not in x for x in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
