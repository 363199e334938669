"""Everything a run settles before its first step: built-in model and data, run directory, logs.

- ``model.path=<built-in policy>`` (``tiny``, ``qwen3-0.6b-arith``) becomes its folder, built once
  per machine and cached (``repro.data.policies``);
  ``data.train_files`` / ``data.val_files`` left at None become the arithmetic task's parquet
  files (``repro.data.ensure_arith_parquet``), both cached under ``$REPRO_CACHE_DIR``.
- The run directory is ``trainer.output_dir`` when given, else
  ``outputs/<experiment_name>_<timestamp>``. With ``trainer.resume_mode=auto`` the latest run
  directory of the same experiment that did not finish and holds a checkpoint is reused, so
  restarting a killed run with the same command continues it in place (``repro.run.resume``
  first makes sure it is the same run).
- ``train.log`` receives every driver log line; ``config.yaml`` is the effective config.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from repro.config import RunConfig, critic_enabled
from repro.data.policies import NAMES, built_in, is_built_in
from repro.run.checkpoints import MARKER, STEP_FORMAT, CheckpointStore

if TYPE_CHECKING:
    from repro.data.policies import BuiltInPolicy

log = logging.getLogger("repro.trainer")

RUN_STATE = "run.json"
LATEST = MARKER
STEP_DIR = STEP_FORMAT


def outputs_root() -> Path:
    """Parent of the run directories: ``$REPRO_OUTPUTS_DIR`` or ``./outputs``."""
    return Path(os.environ.get("REPRO_OUTPUTS_DIR") or "outputs")


def resolve_builtin_assets(cfg: RunConfig) -> RunConfig:
    """A copy of ``cfg`` whose model paths and data files name real folders and files."""
    cfg = copy.deepcopy(cfg)
    # The critic's model only where a critic runs: its default path is the tiny policy, which a
    # GRPO run of another policy must not build (it cost the 0.6B run 30 s of a GPU machine).
    models = [cfg.actor_rollout_ref.model] + ([cfg.critic.model] if critic_enabled(cfg) else [])
    for name in dict.fromkeys(m.path for m in models if is_built_in(m.path)):
        folder = _built_in_folder(built_in(name))
        for m in models:
            if m.path == name:
                m.path = folder
    for m in models:
        if not Path(m.path).is_dir():
            raise ValueError(f"model.path={m.path!r} is not a directory (use a Hugging Face model folder or a "
                             f"built-in policy: {', '.join(NAMES)})")
    if cfg.data.train_files is None or cfg.data.val_files is None:
        from repro.data.arith import ensure_arith_parquet
        from repro.data.sft import cache_root

        train, val = ensure_arith_parquet(cache_root() / "arith" / f"seed{cfg.data.seed}", seed=cfg.data.seed)
        if cfg.data.train_files is None:
            cfg.data.train_files = str(train)
        if cfg.data.val_files is None:
            cfg.data.val_files = str(val)
    return cfg


def _built_in_folder(policy: BuiltInPolicy) -> str:
    """The built-in policy's folder, built first if this machine has no copy (and saying so)."""
    if not policy.is_built() and not policy.is_shipped():
        # The first run is otherwise silent for the build (minutes on a loaded machine).
        log.info("building the %s policy (SFT on %s, about %.1f min; once per machine): it is cached in %s "
                 "(REPRO_CACHE_DIR sets the folder) and every later run reuses it%s",
                 policy.name, policy.device_type.upper(), policy.minutes, policy.cached(), _other_builds(policy))
    if policy.device_type == "cpu":
        # Built in this process, on CPU: CPU and GPU runs then start from the same policy.
        with _quiet_build():
            return str(policy.ensure())
    # A GPU build runs in a child process: the driver must not hold a CUDA context (it would sit on
    # rank 0's GPU through the whole run). Its progress lines go to this console.
    if not policy.is_built():
        proc = subprocess.run([sys.executable, "-m", "repro.data", "policy", policy.name], stdout=sys.stderr)
        if proc.returncode != 0:
            raise RuntimeError(f"building the {policy.name} policy failed (exit {proc.returncode}); "
                               f"run python -m repro.data policy {policy.name} to see why")
    return str(policy.cached())


def _other_builds(policy) -> str:
    """Why a cached build of the same recipe is not used, if there is one (the lease of results/4gpu/README.md,
    fifth, lost minutes to this: the build ran under the image's transformers, the runs under vLLM's)."""
    from repro.data.sft import library_versions

    others = policy.other_library_builds()
    if not others:
        return ""
    here = library_versions()
    names = sorted({k for differ in others.values() for k in differ})
    builds = "; ".join(f"{folder}: " + ", ".join(f"{k} {v}" for k, v in differ.items()) for folder, differ in others.items())
    return (f". The cache holds builds of it under other library versions ({builds}), not usable with "
            + ", ".join(f"{k} {here[k]}" for k in names if k in here) + " here")


class _DropCpuAcceleratorNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Setting accelerator to CPU" not in record.getMessage()


@contextlib.contextmanager
def _quiet_build() -> Iterator[None]:
    """The one-time build says one line of its own; without this it also printed DeepSpeed's
    "Setting accelerator to CPU" (transformers imports DeepSpeed) and a shard-writing progress bar."""
    import transformers

    ds_log, quiet = logging.getLogger("DeepSpeed"), _DropCpuAcceleratorNotice()
    ds_log.addFilter(quiet)
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        ds_log.removeFilter(quiet)
        if bars:
            transformers.utils.logging.enable_progress_bar()


@dataclass
class RunPaths:
    run_dir: Path
    ckpt_dir: Path
    resumed_from: Path | None
    """The checkpoint step directory to load, or None for a fresh start."""
    resume_step: int
    previous_finished: Path | None = None
    """The latest finished run of the same experiment when this one starts a new folder (auto resume)."""

    def start_notes(self) -> list[str]:
        """What the run says first: whether it continues a run or starts a new one beside a finished one."""
        if self.resumed_from is not None:
            return [f"resuming in {self.run_dir} from the step-{self.resume_step} checkpoint"]
        if self.previous_finished is None:
            return []
        state = run_state(self.previous_finished)
        steps = state.get("last_step", state.get("total_steps", "?"))
        return [f"the previous run of this experiment finished ({steps} steps) in {self.previous_finished}; "
                f"this is a new run in {self.run_dir} (trainer.experiment_name=<name> keeps runs apart)"]


def _is_run_of(name: str, experiment: str) -> bool:
    return re.fullmatch(re.escape(experiment) + r"_\d{8}_\d{6}(_\d+)?", name) is not None


def run_state(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RUN_STATE
    return json.loads(path.read_text()) if path.is_file() else {}


def write_run_state(run_dir: Path, **fields: Any) -> None:
    state = run_state(run_dir)
    state.update(fields)
    tmp = run_dir / f".{RUN_STATE}.tmp"
    tmp.write_text(json.dumps(state, indent=1) + "\n")
    os.replace(tmp, run_dir / RUN_STATE)


def latest_checkpoint(ckpt_dir: Path) -> tuple[Path, int] | None:
    """The newest complete checkpoint (by its manifest; the trainer verifies its files before loading)."""
    return CheckpointStore(ckpt_dir).latest()


def _new_run_dir(experiment: str) -> Path:
    root = outputs_root()
    stamp = time.strftime("%Y%m%d_%H%M%S")
    path, k = root / f"{experiment}_{stamp}", 1
    while path.exists():
        path, k = root / f"{experiment}_{stamp}_{k}", k + 1
    return path


def choose_run_paths(cfg: RunConfig) -> RunPaths:
    """Pick the run directory and the checkpoint to resume from (module docstring)."""
    t = cfg.trainer
    previous = None
    if t.output_dir:
        run_dir = Path(t.output_dir)
    elif t.resume_mode == "auto":
        root = outputs_root()
        runs = sorted(p for p in root.iterdir() if p.is_dir() and _is_run_of(p.name, t.experiment_name)) \
            if root.is_dir() else []
        # A folder without a checkpoint has nothing to continue (a run that failed early): never adopt it.
        unfinished = [p for p in runs
                      if run_state(p).get("status") != "finished" and latest_checkpoint(p / "checkpoints")]
        run_dir = unfinished[-1] if unfinished else _new_run_dir(t.experiment_name)
        finished = [p for p in runs if run_state(p).get("status") == "finished"]
        previous = finished[-1] if finished and not unfinished else None
    else:
        run_dir = _new_run_dir(t.experiment_name)
    ckpt_dir = Path(t.default_local_dir) if t.default_local_dir else run_dir / "checkpoints"

    resumed, step = None, 0
    if t.resume_mode == "auto":
        found = latest_checkpoint(ckpt_dir) if ckpt_dir.is_dir() else None
        if found:
            resumed, step = found
    elif t.resume_mode == "resume_path":
        if not t.resume_from_path:
            raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<.../global_step_N>")
        resumed = Path(t.resume_from_path)
        m = re.fullmatch(r"global_step_(\d+)", resumed.name)
        if not resumed.is_dir() or not m:
            raise ValueError(f"trainer.resume_from_path={t.resume_from_path!r} is not a global_step_<N> checkpoint folder")
        step = int(m.group(1))
    run_dir.mkdir(parents=True, exist_ok=True)
    return RunPaths(run_dir=run_dir, ckpt_dir=ckpt_dir, resumed_from=resumed, resume_step=step,
                    previous_finished=previous)


def setup_logging(run_dir: Path) -> logging.Handler:
    """Driver log lines to stderr (INFO) and ``train.log`` (DEBUG); returns the file handler."""
    log.setLevel(logging.DEBUG)
    log.propagate = False
    if not any(getattr(h, "_repro_console", False) for h in log.handlers):
        console = logging.StreamHandler(sys.stderr)
        console.setLevel(logging.INFO)
        console.setFormatter(logging.Formatter("[repro] %(message)s"))
        console._repro_console = True  # type: ignore[attr-defined]
        log.addHandler(console)
    fh = logging.FileHandler(run_dir / "train.log")
    fh.setLevel(logging.DEBUG)
    fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(fh)
    return fh


def write_config_yaml(cfg: RunConfig, path: Path) -> None:
    from omegaconf import OmegaConf

    path.write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
