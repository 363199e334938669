"""Per-step goldens of the CPU main job: ``grpo_tiny``, 10 steps, 2 CPU ranks (issue 36, item 1).

    python scripts/goldens.py --check            # a fresh run against fixtures/goldens/, prints the diff
    python scripts/goldens.py --update           # a fresh run written to fixtures/goldens/
    python scripts/goldens.py --check --run-dir D  # compare an existing run folder, no new run

Exact, not a bound: the job is bitwise reproducible on one machine and torch version (run twice,
every metric below equal to the last bit; the hf rollout's draws are seeded per (seed, step, rank)
and gloo's all-reduce of 2 ranks is order-fixed). Across machines the tiny policy's *weights*
run other kernels (the CPU's instruction set picks ATen's and MKL's paths: results/tiny_policy/README.md),
so every score and loss differs even from the shipped tiny policy: a bound that held across machines
would be wider than the effect of a changed learning rate, so it would check nothing. The golden
therefore keys on the sha256 of the tiny policy's ``model.safetensors``, the torch version and the
CPU's kernel paths (``repro.data.tiny_fixture.kernel_paths``); a machine that differs in any gets a
skip that says so, not a pass or a failure. Timings and memory are not in the golden.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "fixtures" / "goldens" / "grpo_tiny_cpu.json"
STEPS = 10
OVERRIDES = ["trainer.device=cpu", f"trainer.total_training_steps={STEPS}", "trainer.save_freq=-1",
             "trainer.test_freq=-1", "trainer.progress=plain",
             # The hf rollout's own log-probs: rollout_corr/* joins the golden (no effect on the draws).
             "actor_rollout_ref.rollout.calculate_log_probs=True"]
METRICS = ("critic/score/mean", "critic/advantages/mean", "response_length/mean", "actor/pg_loss",
           "actor/grad_norm", "actor/entropy", "actor/ppo_kl", "actor/pg_clipfrac", "actor/lr",
           "rollout_corr/k3_kl", "rollout_corr/log_prob_abs_diff_max")


def policy_identity() -> dict[str, str]:
    """What the golden is valid for: the tiny policy's weight digest, the torch version, the CPU's kernel paths."""
    import torch

    from repro.data.sft import ensure_tiny_policy
    from repro.data.tiny_fixture import kernel_paths

    weights = ensure_tiny_policy(device=torch.device("cpu")) / "model.safetensors"
    return {"policy_sha256": hashlib.sha256(weights.read_bytes()).hexdigest(), **kernel_paths()}


def job_command(extra: list[str]) -> list[str]:
    from repro.config.presets import preset_overrides

    runner = "import sys\nfrom repro.config.loader import load_config\nfrom repro.trainer import run\n" \
             "run(load_config(sys.argv[1:]))\n"
    return [sys.executable, "-c", runner, *preset_overrides("grpo_tiny"), *OVERRIDES, *extra]


def run_job(outputs: Path, extra: list[str], env: dict[str, str] | None = None, timeout: float = 600) -> Path:
    """One fresh job in ``outputs``; its run folder."""
    env = dict(env or os.environ)
    env["REPRO_OUTPUTS_DIR"] = str(outputs)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(job_command(extra), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"golden job failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    [run_dir] = [d for d in outputs.iterdir() if d.is_dir()]
    return run_dir


def read_steps(run_dir: Path) -> list[dict[str, float]]:
    from repro.rl.metrics import MetricsLog

    rows = MetricsLog(run_dir / "metrics.tsv").rows  # floats written with repr: exact
    return [{k: row[k] for k in METRICS if k in row} for row in rows]


def diff(golden: list[dict], fresh: list[dict]) -> list[str]:
    """One line per value that is not bitwise equal (``repr`` round-trips a float exactly)."""
    lines = []
    if len(golden) != len(fresh):
        lines.append(f"steps: golden {len(golden)}, fresh {len(fresh)}")
    for step, (g, f) in enumerate(zip(golden, fresh, strict=False), start=1):
        for key in sorted(set(g) | set(f)):
            a, b = g.get(key), f.get(key)
            same = a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
            if not same:
                lines.append(f"step {step:2d} {key}: golden {a!r} fresh {b!r}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true")
    mode.add_argument("--update", action="store_true")
    ap.add_argument("--run-dir", type=Path, help="an existing run folder instead of a fresh run")
    ap.add_argument("extra", nargs="*", help="overrides after the golden's own (e.g. to show a change fails)")
    args = ap.parse_args(argv)
    identity = policy_identity()
    if args.check:
        golden = json.loads(GOLDEN.read_text())
        if golden["identity"] != identity:
            print(f"SKIP: the golden is for {golden['identity']}, this machine has {identity} "
                  "(the tiny policy's weights differ between CPU models, issue 37)")
            return 0
    with tempfile.TemporaryDirectory(prefix="goldens.") as tmp:
        run_dir = args.run_dir or run_job(Path(tmp), args.extra)
        fresh = read_steps(run_dir)
    if args.update:
        GOLDEN.write_text(json.dumps({"identity": identity, "command": OVERRIDES, "steps": fresh}, indent=1) + "\n")
        print(f"wrote {GOLDEN.relative_to(ROOT)} ({len(fresh)} steps)")
        return 0
    lines = diff(golden["steps"], fresh)
    print("\n".join(lines) if lines else f"OK: {len(fresh)} steps bitwise equal to {GOLDEN.relative_to(ROOT)}")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
