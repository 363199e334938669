"""Write results/run_safety.md: real runs of the tiny GRPO job showing the run-safety behaviours.

    PYTHONPATH=. DS_ACCELERATOR=cpu python scripts/run_safety_demo.py [results/run_safety.md]

A run (12 steps, checkpoint every 2) is launched; a second launch of the same command while it is
live (past its first checkpoint); Ctrl-C (SIGINT) a few steps later; a relaunch with another lr and data seed; the
deliberate change through resume_path + allow_config_change; the same command resuming; a model
folder with truncated weights (an error inside the ranks). Every command and its output is recorded.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["trainer.device=cpu", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=4",
         "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
         "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16", "trainer.progress=plain",
         "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.total_training_steps=12",
         "trainer.save_freq=2"]


class Demo:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.env = {**os.environ, "REPRO_OUTPUTS_DIR": str(tmp / "outputs"), "PYTHONPATH": str(ROOT),
                    "DS_ACCELERATOR": "cpu"}
        self.lines: list[str] = []

    def cmd(self, *overrides: str) -> list[str]:
        return [sys.executable, "-m", "repro.main_ppo", "-cn", "grpo_tiny", *SMALL, *overrides]

    def show(self, argv: list[str]) -> str:
        text = shlex.join(["python", *argv[1:]]).replace(str(self.tmp), "$TMP")
        return text.replace(" ".join(shlex.quote(a) for a in SMALL), "$SMALL")

    def record(self, title: str, argv: list[str], code: int, seconds: float, output: str, keep=None) -> None:
        lines = [ln for ln in output.splitlines() if keep is None or keep(ln)]
        self.lines += [f"### {title}", "", "```", f"$ {self.show(argv)}", *[ln.replace(str(self.tmp), "$TMP") for ln in lines],
                       f"# exit {code} after {seconds:.1f} s", "```", ""]

    def run(self, title: str, argv: list[str], keep=None) -> subprocess.CompletedProcess:
        start = time.monotonic()
        proc = subprocess.run(argv, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=600)
        self.record(title, argv, proc.returncode, time.monotonic() - start, proc.stderr + proc.stdout, keep)
        return proc

    def file(self, title: str, path: Path, pick=None) -> None:
        text = path.read_text()
        if pick:
            text = json.dumps(pick(json.loads(text)), indent=1)
        self.lines += [f"`{str(path).replace(str(self.tmp), '$TMP')}` ({title}):", "", "```", text.replace(str(self.tmp), "$TMP").rstrip(), "```", ""]


def _interesting(line: str) -> bool:
    return line.startswith(("error:", "[repro]", "output:", "warning: took")) and "step " not in line[:14] or "interrupted" in line


def main(out: Path) -> int:
    with tempfile.TemporaryDirectory() as d:
        demo = Demo(Path(d))
        argv = demo.cmd()
        live = subprocess.Popen(argv, cwd=ROOT, env=demo.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        start = time.monotonic()
        outputs = Path(d) / "outputs"
        while not list(outputs.glob("*/checkpoints/latest_checkpointed_iteration.txt")):
            time.sleep(0.2)
        run_dir = next(outputs.glob("grpo_tiny_arith_*"))
        demo.run("A second launch of the same command while the first one runs (past its first checkpoint)", argv)
        stopped = time.monotonic()
        live.send_signal(signal.SIGINT)
        text, _ = live.communicate(timeout=120)
        demo.record(f"Ctrl-C (SIGINT to the driver) a few steps later; it stopped {time.monotonic() - stopped:.1f} s "
                    "after the signal", argv, live.returncode, time.monotonic() - start, text, _interesting)
        demo.file("after the interrupt", run_dir / "run.json",
                  lambda s: {k: v for k, v in s.items() if k not in ("config",)})
        demo.run("The same folder with another lr and data seed (auto-resume)",
                 demo.cmd("actor_rollout_ref.actor.optim.lr=1e-3", "data.seed=3"))
        ckpt = Path(json.loads((run_dir / "run.json").read_text())["last_checkpoint"])
        demo.run("The change made on purpose: resume_path + allow_config_change",
                 demo.cmd("actor_rollout_ref.actor.optim.lr=1e-3", "trainer.resume_mode=resume_path",
                          f"trainer.resume_from_path={ckpt}", "trainer.allow_config_change=[actor_rollout_ref.actor.optim.lr]",
                          f"trainer.output_dir={Path(d) / 'changed'}"), _interesting)
        demo.file("config_changes of the deliberate change", Path(d) / "changed" / "run.json",
                  lambda s: {k: s[k] for k in ("status", "config_changes")})
        log = [ln for ln in (Path(d) / "changed" / "train.log").read_text().splitlines() if "config changed" in ln]
        demo.lines += ["Its `train.log`:", "", "```", *log, "```", ""]
        demo.run("The original command again: resumes the interrupted folder and finishes it", argv, _interesting)

        import torch

        from repro.data.sft import ensure_tiny_policy

        model = Path(d) / "model"
        shutil.copytree(ensure_tiny_policy(device=torch.device("cpu")), model)
        weights = model / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
        demo.run("An error inside the ranks (model folder with truncated weights)",
                 demo.cmd(f"actor_rollout_ref.model.path={model}", f"trainer.output_dir={Path(d) / 'bad_model'}"),
                 lambda ln: ln.startswith("error:"))
    head = ["# Run safety: lock, interrupt, resume only the same run, rank errors", "",
            f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.node()} (CPU ranks, 2 shared cores; "
            "times are noisy), with `PYTHONPATH=. DS_ACCELERATOR=cpu python scripts/run_safety_demo.py`.",
            f"`$SMALL` = `{' '.join(SMALL)}`; `$TMP` = the script's temporary folder; run output is filtered to the driver's "
            "`[repro]` / `error:` lines.", ""]
    out.write_text("\n".join(head + demo.lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "results/run_safety.md")))
