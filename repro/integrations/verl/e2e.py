"""verl's own trainer, end to end, on repro's task: GRPO with ``model_engine=deepspeed`` or ``dp``.

    python -m repro.integrations.verl.e2e --engine deepspeed --steps 30 --out results/verl_engine/e2e
    python -m repro.integrations.verl.e2e --engine dp --recipe seed --steps 20 --out /tmp/verl_seed

It prepares what verl's ``main_ppo`` needs from repro (the built-in policy, the arithmetic task in
verl's parquet schema, repro's reward as verl's ``custom_reward_function``), runs ``python -m
verl.trainer.main_ppo`` with a peer recipe (``repro.config.peer_recipes``: ``tiny``, the ``grpo_tiny``
preset on one GPU, or ``seed``, ``grpo_0p6b`` on two) in verl's keys, the very keys repro's trainer
reads but for the few :data:`REPRO_ONLY` ones, with verl's vLLM rollout, and turns verl's console
metrics into ``metrics.tsv`` (after every step) and ``summary.json``.
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

from repro.config.peer_recipes import RECIPES, PeerRecipe
from repro.config.peer_recipes import recipe as peer_recipe
from repro.integrations.verl import SEARCHPATH

SCORE = "critic/score/mean"
MARGIN, TAIL = 0.10, 5
_METRIC = re.compile(r"([\w/@.\-]+):([-+0-9.eE]+|nan|inf)")


# repro's keys verl has no key for, and why dropping them changes nothing a peer table compares.
REPRO_ONLY = {
    "trainer.seed": "repro's rollout and update seed; verl seeds its engines itself (42) and has no such key",
}


def recipe_keys(recipe: PeerRecipe, engine: str, policy: Path) -> list[str]:
    """The recipe's keys (repro's preset and the recipe's own) in verl's names: the same key and value
    where verl has it (repro's schema is verl's), else translated or dropped (:data:`REPRO_ONLY`)."""
    out = []
    for key, value in recipe.values().items():
        if key in REPRO_ONLY or (key.startswith("actor_rollout_ref.actor.deepspeed.") and engine != "deepspeed"):
            continue
        if key == "actor_rollout_ref.model.path":
            value = str(policy)
        elif key.startswith("reward.reward_kwargs."):
            # repro's rule reward reads them from reward.reward_kwargs; verl hands its custom reward
            # function's reward_kwargs to it (repro.integrations.verl.reward), a key verl's yaml lacks.
            key = "+reward.custom_reward_function." + key.removeprefix("reward.")
        out.append(f"{key}={value}")
    return out


def overrides(engine: str, steps: int, policy: Path, train: Path, val: Path, out: Path, zero_stage: int,
              micro: int | None = None, vllm_sleep: bool | None = None, recipe: str = "tiny") -> list[str]:
    """verl's command line for a run of peer recipe ``recipe`` (``repro.config.peer_recipes``).
    ``micro``: samples per update micro-batch; ``vllm_sleep``: vLLM frees its memory while the actor
    trains; both default to the recipe's."""
    r = peer_recipe(recipe)
    micro = r.micro if micro is None else micro
    vllm_sleep = r.vllm_sleep if vllm_sleep is None else vllm_sleep
    reward = Path(__file__).with_name("reward.py")
    args = [
        f"model_engine={engine}", *recipe_keys(r, engine, policy),
        f"data.train_files={train}", f"data.val_files={val}",
        # No flash-attn on the GPU image: verl's remove-padding path needs it, so SDPA on padded batches.
        "actor_rollout_ref.model.use_remove_padding=False", "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", f"actor_rollout_ref.rollout.free_cache_engine={vllm_sleep}",
        f"reward.custom_reward_function.path={reward}", "reward.custom_reward_function.name=compute_score",
        f"trainer.total_training_steps={steps}", "trainer.total_epochs=1000", "trainer.logger=[console]",
        "trainer.project_name=repro", f"trainer.experiment_name={r.preset}_{engine}",
        f"trainer.default_local_dir={out / 'ckpt'}",
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


# The figures a step's console line keeps, in this order: verl's own line runs to thousands of characters, and a
# line cut at a fixed width kept only its balance metrics when a 4-GPU run was lost mid-way (results/4gpu/README.md).
STEP_LINE = ((SCORE, "score"), ("timing_s/step", "s/step"), ("timing_s/gen", "gen"),
             ("timing_s/old_log_prob", "old log-prob"), ("timing_s/update_actor", "update"),
             ("perf/throughput", "tokens/s/GPU"), ("actor/perf/max_memory_allocated_gb", "actor max allocated GB"))


def step_line(row: dict[str, float]) -> str:
    """One step's figures in a short line: ``step 3: score 0.412, s/step 19.8, ...`` (those present)."""
    return f"step {int(row['step'])}: " + ", ".join(f"{name} {row[key]:.4g}" for key, name in STEP_LINE if key in row)


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
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="tiny",
                        help="peer recipe (repro.config.peer_recipes): tiny (1 GPU) or seed (the 0.6B policy, 2 GPUs)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--micro", type=int, default=None, help="samples per update micro-batch (default: the recipe's)")
    parser.add_argument("--vllm-sleep", action=argparse.BooleanOptionalAction, default=None,
                        help="vLLM frees its GPU memory while the actor trains (free_cache_engine; default: the recipe's)")
    parser.add_argument("--out", type=Path, default=Path("results/verl_engine/e2e"))
    parser.add_argument("--run-dir", type=Path, default=None, help="the run's folder (default: --out/<dp or deepspeed-zero<stage>>)")
    parser.add_argument("--print-config", action="store_true", help="compose verl's config and print it; no run")
    parser.add_argument("--plot", action="store_true", help="draw the score curves of the runs under --out; no run")
    args, extra = parser.parse_known_args(argv)
    if args.plot:
        runs = sorted(d for d in args.out.iterdir() if (d / "metrics.tsv").is_file())
        plot(runs, args.out / "curves.png")
        return 0
    from repro.data.arith import ensure_arith_parquet
    from repro.data.policies import built_in
    from repro.data.sft import cache_root

    run_dir = args.run_dir or args.out / run_name(args.engine, args.zero_stage)
    run_dir.mkdir(parents=True, exist_ok=True)
    train, val = ensure_arith_parquet(cache_root() / "arith")
    policy = Path(peer_recipe(args.recipe).policy) if args.print_config else built_in(peer_recipe(args.recipe).policy).ensure()
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo",
           *overrides(args.engine, args.steps, policy, train, val, run_dir, args.zero_stage, args.micro, args.vllm_sleep,
                      args.recipe),
           *extra]
    # verl imports its plugins in every process, Ray's workers included; without a pip install of
    # repro the entry point is not there, and verl's module list (inherited by the workers) names it.
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("VERL_USE_EXTERNAL_MODULES", "repro.integrations.verl.plugin")
    if args.print_config:
        return subprocess.call([*cmd, "--cfg", "job"], env=env)
    (run_dir / "command.txt").write_text(" ".join(cmd) + "\n")
    rows: list[dict[str, float]] = []
    with open(run_dir / "console.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            log.write(line)
            if "step:" in line and SCORE in line:
                # Written after every step: a run stopped from outside (a time limit) keeps its steps.
                new = parse_console(line)
                rows += new
                write_tsv(rows, run_dir / "metrics.tsv")
                for row in new:
                    print(step_line(row), flush=True)
        rc = proc.wait()
    if rc or not rows:
        print(f"verl's trainer exited {rc} after {len(rows)} steps; log {run_dir / 'console.log'}", file=sys.stderr)
        return rc or 1
    summary = summarize(rows)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    if summary["rise"] < MARGIN:
        print(f"FAIL: score rose {summary['rise']:.3f} < {MARGIN} (step 1 -> last {TAIL})", file=sys.stderr)
        return 1
    return 0


def run_name(engine: str, zero_stage: int) -> str:
    """The run's folder under ``--out``: ``dp`` or ``deepspeed-zero<stage>``."""
    return engine if engine == "dp" else f"deepspeed-zero{zero_stage}"


if __name__ == "__main__":
    sys.exit(main())
