"""Benchmark cases as real training runs: one ``python -m repro.main_ppo`` subprocess per case and seed.

A case is a named set of ZeRO overrides (and environment knobs) put on top of a base command line
(default ``-cn grpo_tiny``; any preset or verl command line works, PPO too: the critic gets the
same ZeRO stage and offload as the actor). Each run writes into ``<out>/<case>/`` (one seed) or
``<out>/seed<seed>/<case>/`` through ``trainer.output_dir``, so ``train.log`` and ``metrics.tsv``
land there. A failed run is retried from scratch; the failed attempt's files move to
``failed_attempt<k>/`` inside the case folder and its output to ``attempt<k>.log``, and the
summary row says how many retries it took (a failure is recorded, never hidden).

``REPRO_BENCH_FAIL_FIRST=<case>[,<case>...]`` makes the first attempt of those cases fail for
real: the run gets an unknown config key, so ``repro.main_ppo`` exits 2 (the test of the retry).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.bench.summary import case_row
from repro.config import ENV_PARAM_OFFLOAD, ENV_STEP_EACH_MICRO
from repro.rl.metrics import MetricsLog

FAIL_FIRST_ENV = "REPRO_BENCH_FAIL_FIRST"
_FORCED_FAILURE = "+trainer.repro_bench_forced_failure=1"
DEFAULT_BASE = ("-cn", "grpo_tiny")


@dataclass(frozen=True)
class Case:
    """One benchmark case: ZeRO stage and offload for every trainable role, plus env knobs."""

    name: str
    zero_stage: int
    offload: str = "none"
    env: Mapping[str, str] = field(default_factory=dict)
    """Environment knobs of this case (win over the caller's environment)."""

    def overrides(self) -> list[str]:
        out = []
        for prefix in ("actor_rollout_ref.actor.deepspeed", "critic.deepspeed_config"):
            out += [f"{prefix}.zero_stage={self.zero_stage}", f"{prefix}.offload={self.offload}"]
        return out

    @property
    def step_each_micro(self) -> str | None:
        return self.env.get(ENV_STEP_EACH_MICRO)


# The seed's six cases; zero3_cpu_offload also offloads the parameters (VERL_ENABLE_PARAM_OFFLOAD=1),
# as in the seed's command line.
SIX_CASES = (
    Case("zero1_no_offload", 1),
    Case("zero2_no_offload", 2),
    Case("zero3_no_offload", 3),
    Case("zero1_cpu_offload", 1, "cpu"),
    Case("zero2_cpu_offload", 2, "cpu"),
    Case("zero3_cpu_offload", 3, "cpu", {ENV_PARAM_OFFLOAD: "1"}),
)


def crossover_cases(step_modes: Sequence[int]) -> list[Case]:
    """ZeRO-1 and ZeRO-2 without offload, once per ``VERL_DS_ZERO2_STEP_EACH_MICRO`` mode."""
    return [Case(f"zero{stage}_sem{mode}", stage, "none", {ENV_STEP_EACH_MICRO: str(mode)})
            for mode in step_modes for stage in (1, 2)]


def crossover_comparisons(step_modes: Sequence[int]) -> list[tuple[str, str, str]]:
    """(comparison, a, b): ZeRO-2 minus ZeRO-1 per mode, and mode 1 minus mode 0 per stage."""
    out = [(f"z2-z1@sem{m}", f"zero1_sem{m}", f"zero2_sem{m}") for m in step_modes]
    if 0 in step_modes and 1 in step_modes:
        out += [(f"sem1-sem0@zero{s}", f"zero{s}_sem0", f"zero{s}_sem1") for s in (1, 2)]
    return out


def case_command(case: Case, base: Sequence[str], *, steps: int, seed: int, out_dir: Path) -> list[str]:
    """The ``repro.main_ppo`` command line of one run (later overrides win over the base's)."""
    return [sys.executable, "-m", "repro.main_ppo", *base, *case.overrides(),
            f"trainer.total_training_steps={steps}", f"trainer.seed={seed}", f"data.seed={seed}",
            f"trainer.output_dir={out_dir}", "trainer.resume_mode=disable", "trainer.progress=plain"]


def case_env(case: Case, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if environ is None else environ)
    env.update(case.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _park_failed_attempt(case_dir: Path, attempt: int) -> None:
    """Move what a failed attempt wrote into ``failed_attempt<k>/`` so the retry starts clean."""
    parked = case_dir / f"failed_attempt{attempt}"
    parked.mkdir()
    for entry in case_dir.iterdir():
        if entry.name.startswith(("failed_attempt", "attempt")):
            continue
        shutil.move(str(entry), parked / entry.name)


def _placement(rows: Sequence[Mapping[str, Any]], key: str) -> str | None:
    values = [r.get(key) for r in rows if isinstance(r.get(key), float)]
    if not values:
        return None
    return "cpu_offload" if values[-1] >= 0.5 else "device"


def run_case(case: Case, seed: int, base: Sequence[str], *, steps: int, case_dir: Path, retries: int,
             timeout_s: float, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Run one case (with up to ``retries`` retries) and return its summary.tsv row."""
    case_dir.mkdir(parents=True, exist_ok=True)
    env = case_env(case, environ)
    fail_first = {c for c in env.get(FAIL_FIRST_ENV, "").split(",") if c}
    status, attempt, started = "failed", 0, time.monotonic()
    for attempt in range(1, retries + 2):
        if attempt > 1:
            _park_failed_attempt(case_dir, attempt - 1)
        cmd = case_command(case, base, steps=steps, seed=seed, out_dir=case_dir)
        if attempt == 1 and case.name in fail_first:
            cmd.append(_FORCED_FAILURE)
        started = time.monotonic()
        with open(case_dir / f"attempt{attempt}.log", "w") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            try:
                code = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s).returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
            log.write(f"exit: {code}\n")
        if code == 0 and (case_dir / "metrics.tsv").is_file():
            status = "ok"
            break
    wall = time.monotonic() - started  # of the last attempt
    rows = MetricsLog(case_dir / "metrics.tsv").rows if (case_dir / "metrics.tsv").is_file() else []
    extra = {
        "optimizer_on": _placement(rows, "ds/optimizer_offloaded"),
        "params_on": _placement(rows, "ds/params_offloaded"),
        "zero_stage": case.zero_stage,
        "step_each_micro": case.step_each_micro,
    }
    return case_row(case.name, seed, rows if status == "ok" else [], status=status, retries=attempt - 1,
                    wall_s=round(wall, 2), extra=extra)


def validate_base(base: Sequence[str], case: Case, environ: Mapping[str, str] | None = None) -> str | None:
    """Dry-run the first case's command line; the error line of a bad base, else None."""
    cmd = case_command(case, base, steps=1, seed=0, out_dir=Path("unused")) + ["trainer.dry_run=true"]
    proc = subprocess.run(cmd, env=case_env(case, environ), capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    return errors[-1] if errors else (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
