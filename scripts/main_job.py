"""Regenerate results/main_job/ from the README's first command: the figures the README quotes.

    python scripts/main_job.py [--out results/main_job] [-- extra overrides]

Runs ``python -m repro.main_ppo -cn grpo_tiny`` (a fresh run folder in a temporary outputs
root, so no earlier run is resumed) and copies its ``summary.tsv``, ``metrics.tsv``,
``curves.png`` and the tiny policy's build report (``tiny_policy.json``: SFT steps, held-out
accuracy, torch and transformers versions) into ``--out``. ``tests/unit/test_readme_figures.py``
fails when the README's main-job figures are not those files' (``readme_figures`` below).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ("summary.tsv", "metrics.tsv", "curves.png", "config.yaml")


def readme_figures(result_dir: Path) -> list[str]:
    """The phrases the README and results/main_job.md quote, made from the committed result."""
    with (result_dir / "summary.tsv").open() as f:
        summary = {row[0]: row[1] for row in csv.reader(f, delimiter="\t") if len(row) == 2}
    sft = json.loads((result_dir / "tiny_policy.json").read_text())
    num = {k: float(v) for k, v in summary.items() if k.endswith(("score", "tail5", "train"))}
    return [
        f"score {num['first_score']:.3f} -> last-5 {num['avg_score_tail5']:.3f}",
        f"validation {num['val_before_train']:.3f} -> {num['last_val_score']:.3f}",
        f"{sft['sft_steps']} SFT steps to {sft['accuracy_after']:.3f} held-out",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "main_job")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides (after --)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="repro-main-job-") as tmp:
        env = dict(os.environ, REPRO_OUTPUTS_DIR=tmp)
        cmd = [sys.executable, "-m", "repro.main_ppo", "-cn", "grpo_tiny", *args.overrides]
        print("running:", " ".join(cmd), flush=True)
        rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
        if rc:
            print(f"the main job exited {rc}; {args.out} is left as it was", file=sys.stderr)
            return rc
        run_dir = next(Path(tmp).glob("grpo_tiny_arith_*"))
        args.out.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            shutil.copy2(run_dir / name, args.out / name)
    sys.path.insert(0, str(ROOT))
    import torch

    from repro.data.sft import ensure_tiny_policy, read_report

    report = read_report(ensure_tiny_policy(device=torch.device("cpu")))  # cached: the run built it
    report.pop("history", None)
    (args.out / "tiny_policy.json").write_text(json.dumps(report, indent=1) + "\n")
    for phrase in readme_figures(args.out):
        print(phrase)
    return 0


if __name__ == "__main__":
    sys.exit(main())
