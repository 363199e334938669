"""verl's own trainer, end to end, on repro's tiny task: GRPO with ``model_engine=deepspeed`` or ``dp``.

    python -m repro.integrations.verl.e2e --engine deepspeed --steps 30 --out results/verl_engine/e2e
    python -m repro.integrations.verl.e2e --engine dp --steps 30 --out results/verl_engine/e2e

It prepares what verl's ``main_ppo`` needs from repro (the warm-started tiny policy, the arithmetic
task in verl's parquet schema, repro's reward as verl's ``custom_reward_function``), runs
``python -m verl.trainer.main_ppo`` with the ``grpo_tiny`` recipe in verl's keys (32 prompts x 8
samples, 12 new tokens, lr 1e-4, 2 epochs x 2 mini-batches, clip 0.2, no KL) on one GPU with
verl's vLLM rollout, and turns verl's console metrics into ``metrics.tsv`` and ``summary.json``.
The check is the gate's margin: the mean score of the last 5 steps exceeds step 1's by >= 0.10.
``--print-config`` composes verl's config (``--cfg job``) without running: the CPU check.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from repro.integrations.verl import SEARCHPATH

SCORE = "critic/score/mean"
MARGIN, TAIL = 0.10, 5
_METRIC = re.compile(r"([\w/@.\-]+):([-+0-9.eE]+|nan|inf)")


def overrides(engine: str, steps: int, policy: Path, train: Path, val: Path, out: Path, zero_stage: int,
              micro: int = 64, vllm_sleep: bool = True) -> list[str]:
    """verl's command line for the run (the grpo_tiny recipe; verl's keys). ``micro``: samples per
    update micro-batch; ``vllm_sleep``: vLLM frees its memory while the actor trains (verl's default)."""
    reward = Path(__file__).with_name("reward.py")
    args = [
        f"model_engine={engine}",
        "algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=True", "algorithm.use_kl_in_reward=False",
        f"data.train_files={train}", f"data.val_files={val}", "data.train_batch_size=32",
        "data.max_prompt_length=16", "data.max_response_length=12", "data.seed=0",
        f"actor_rollout_ref.model.path={policy}", "actor_rollout_ref.model.use_remove_padding=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.optim.lr=1e-4", "actor_rollout_ref.actor.ppo_epochs=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16", f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.actor.clip_ratio=0.2", "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0.0",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.top_p=1.0",
        "actor_rollout_ref.rollout.top_k=-1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3", "actor_rollout_ref.rollout.enforce_eager=True",
        f"actor_rollout_ref.rollout.free_cache_engine={vllm_sleep}",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=128",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=128",
        f"reward.custom_reward_function.path={reward}", "reward.custom_reward_function.name=compute_score",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", f"trainer.total_training_steps={steps}",
        "trainer.total_epochs=1000", "trainer.logger=[console]", "trainer.val_before_train=False",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.project_name=repro",
        f"trainer.experiment_name=grpo_tiny_{engine}", f"trainer.default_local_dir={out / 'ckpt'}",
    ]
    if engine == "deepspeed":
        args += [f"hydra.searchpath=[{SEARCHPATH}]", f"actor_rollout_ref.actor.deepspeed.zero_stage={zero_stage}"]
    return args


def parse_console(text: str) -> list[dict[str, float]]:
    """verl's console logger lines (``step:N - key:value - ...``) as rows."""
    rows = []
    for line in text.splitlines():
        if "step:" not in line or SCORE not in line:
            continue
        row = {k: float(v) for k, v in _METRIC.findall(line[line.index("step:"):])}
        if "step" in row:
            rows.append(row)
    return rows


def summarize(rows: list[dict[str, float]]) -> dict[str, float]:
    scores = [r[SCORE] for r in rows]
    tail = sum(scores[-TAIL:]) / min(TAIL, len(scores))
    step_s = [r["timing_s/step"] for r in rows if "timing_s/step" in r]
    return {"steps": len(rows), "score_step1": scores[0], f"score_last{TAIL}": tail, "rise": tail - scores[0],
            "best": max(scores), "median_step_s": sorted(step_s)[len(step_s) // 2] if step_s else float("nan")}


def write_tsv(rows: list[dict[str, float]], path: Path) -> None:
    keys = sorted({k for r in rows for k in r}, key=lambda k: (k != "step", k))
    lines = ["\t".join(keys)] + ["\t".join(f"{r.get(k, float('nan')):.6g}" for k in keys) for r in rows]
    path.write_text("\n".join(lines) + "\n")


def plot(run_dirs: list[Path], out: Path) -> None:
    """The runs' score curves on one chart (each run's metrics.tsv)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for run in run_dirs:
        lines = (run / "metrics.tsv").read_text().splitlines()
        keys = lines[0].split("\t")
        rows = [dict(zip(keys, map(float, line.split("\t")), strict=True)) for line in lines[1:]]
        ax.plot([r["step"] for r in rows], [r[SCORE] for r in rows], label=run.name)
    ax.set_xlabel("step")
    ax.set_ylabel(SCORE)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m repro.integrations.verl.e2e", description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=["deepspeed", "dp"], default="deepspeed")
    parser.add_argument("--zero-stage", type=int, choices=[1, 2, 3], default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--micro", type=int, default=64, help="samples per update micro-batch")
    parser.add_argument("--vllm-sleep", action=argparse.BooleanOptionalAction, default=True,
                        help="vLLM frees its GPU memory while the actor trains (free_cache_engine)")
    parser.add_argument("--out", type=Path, default=Path("results/verl_engine/e2e"))
    parser.add_argument("--print-config", action="store_true", help="compose verl's config and print it; no run")
    parser.add_argument("--plot", action="store_true", help="draw the score curves of the runs under --out; no run")
    args, extra = parser.parse_known_args(argv)
    if args.plot:
        runs = sorted(d for d in args.out.iterdir() if (d / "metrics.tsv").is_file())
        plot(runs, args.out / "curves.png")
        return 0
    from repro.data.arith import ensure_arith_parquet
    from repro.data.sft import cache_root, ensure_tiny_policy

    run_dir = args.out / (args.engine if args.engine == "dp" else f"deepspeed-zero{args.zero_stage}")
    run_dir.mkdir(parents=True, exist_ok=True)
    train, val = ensure_arith_parquet(cache_root() / "arith")
    policy = Path("tiny") if args.print_config else ensure_tiny_policy()
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo",
           *overrides(args.engine, args.steps, policy, train, val, run_dir, args.zero_stage, args.micro, args.vllm_sleep),
           *extra]
    # verl imports its plugins in every process, Ray's workers included; without a pip install of
    # repro the entry point is not there, and verl's module list (inherited by the workers) names it.
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("VERL_USE_EXTERNAL_MODULES", "repro.integrations.verl.plugin")
    if args.print_config:
        return subprocess.call([*cmd, "--cfg", "job"], env=env)
    (run_dir / "command.txt").write_text(" ".join(cmd) + "\n")
    with open(run_dir / "console.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            log.write(line)
            if "step:" in line and SCORE in line:
                print(line.rstrip()[:300], flush=True)
        rc = proc.wait()
    rows = parse_console((run_dir / "console.log").read_text())
    if rc or not rows:
        print(f"verl's trainer exited {rc} after {len(rows)} steps; log {run_dir / 'console.log'}", file=sys.stderr)
        return rc or 1
    write_tsv(rows, run_dir / "metrics.tsv")
    summary = summarize(rows)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    if summary["rise"] < MARGIN:
        print(f"FAIL: score rose {summary['rise']:.3f} < {MARGIN} (step 1 -> last {TAIL})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
