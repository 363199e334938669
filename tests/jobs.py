"""Job harness: real training jobs in a subprocess, and what the tests read back from them.

Every job-level test starts its jobs and reads their outputs through this module:

- CPU jobs on 2 gloo ranks through Ray: ``tests/e2e/test_trainer.py``, ``test_lora_run.py``,
  ``test_checkpoint_fallback.py``, ``test_run_safety.py``, ``cluster/test_multinode.py``;
- verl's algorithm set end to end, several jobs in one driver: ``tests/e2e/test_verl_algorithms_e2e.py``;
- verl 0.9.1's own trainer with repro's engine (``tests/verl_parity/engine/trainer_job.py``, in .venv-verl);
- the GPU gate (NCCL, a ``gate.json`` record per case): ``tests/gpu_e2e/test_grpo_gate.py``.

A job is the trainer as a user runs it, in a process of its own: either the CLI
(:func:`cli_command`: ``python -m repro.main_ppo -cn <preset> ...``, for what the CLI itself does:
pre-flight, exit codes and one-line errors, signals, resume) or :data:`RUNNER`
(:func:`runner_command`: the CLI's ``load_config`` + ``repro.trainer.run`` alone, for what the run
produces; an exception is a traceback and exit 1). Its
environment comes from :func:`job_env`, it runs through :func:`run` (or :func:`start` for a job the
test watches or interrupts), and its run folder is read with :func:`metrics`, :func:`summary`,
:func:`run_config` and checked with :func:`check_outputs`; a GPU case's memory budget with vLLM is
:func:`with_vllm_engine`. Rank-level tests (a function on N ranks, no job) use
``tests/multirank.py`` instead. Test modules never import each other
(``tests/unit/test_test_layout.py``): what they share lives here.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from repro.config.presets import preset_overrides
from repro.rl.metrics import MetricsLog, read_summary
from repro.run.checkpoints import MARKER
from tests.subprocess_env import pythonpath

ROOT = Path(__file__).resolve().parents[1]

# The presets' tiny task shrunk to a few small steps on 2 CPU ranks (a step in seconds, not minutes).
SMALL = [
    "trainer.device=cpu",
    "data.train_batch_size=8",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "trainer.progress=plain",
]
# The uninterrupted 3-step GRPO job that two proofs compare with bitwise: the 2-node run
# (tests/e2e/cluster/test_multinode.py) and the run resumed after a kill -9
# (tests/e2e/test_run_safety.py). Both build their own runs from these overrides, so the
# reference is the same config by construction, and one run of it serves both (:class:`SharedRun`).
# No validation: neither compares a validation figure (and it leaves the training rows bitwise as
# they are, results/test_suite_speed.md, 2026-11-26); a checkpoint at step 2, where both interrupt.
GRPO_3_STEPS = [*SMALL, "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.total_training_steps=3",
                "trainer.save_freq=2"]
# The 3-step PPO job (actor and critic) that tests/e2e/test_trainer.py checks as a run
# (every output, finite actor and critic metrics) and tests/e2e/test_checkpoint_fallback.py
# checks for which checkpoints each role keeps: one job serves both (:class:`SharedRun`). Saving
# every step does not touch a metric check_outputs reads, and the keep limits only prune folders.
# No validation: it does not touch the critic (Trainer.validate: rollout and reward) and is
# proven in test_trainer's GRPO run.
PPO_3_STEPS_KEEP = [*SMALL, "trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.test_freq=-1",
                    "trainer.val_before_train=False", "critic.ppo_mini_batch_size=4",
                    "critic.ppo_micro_batch_size_per_gpu=8", "critic.forward_micro_batch_size_per_gpu=16",
                    "trainer.max_actor_ckpt_to_keep=1", "trainer.max_critic_ckpt_to_keep=2"]
# Metrics that must be identical between a resumed run and an uninterrupted one (timings excluded).
DETERMINISTIC = ("critic/score/mean", "critic/advantages/mean", "response_length/mean", "actor/pg_loss",
                 "actor/grad_norm", "actor/entropy", "actor/ppo_kl", "actor/lr")

# Builds the config the way the CLI does (load_config of the overrides) and runs it in this
# process. With ``--each JSON`` it runs a list of (status file, overrides) jobs one after the
# other in one driver, so that start-up (imports, ray.init) is paid once; each job's "ok" or
# traceback goes to its status file and a failed job does not stop the next.
RUNNER = """\
import json, sys, traceback
from repro.config.loader import load_config
from repro.trainer import run
if sys.argv[1:2] != ["--each"]:
    run(load_config(sys.argv[1:]))
else:
    for status, overrides in json.loads(sys.argv[2]):
        try:
            run(load_config(overrides))
            result = "ok"
        except BaseException:
            result = traceback.format_exc()
        open(status, "w").write(result)
"""


def runner_command(preset: str | None, overrides: list[str]) -> list[str]:
    """:data:`RUNNER` on ``preset``'s overrides (none: ``None``) followed by ``overrides`` (later ones win).

    The preset is expanded here, so the command line carries the whole config (the GPU gate
    records it in ``gate.json``)."""
    return [sys.executable, "-c", RUNNER, *(preset_overrides(preset) if preset else []), *overrides]


def runner_each_command(preset: str | None, jobs: list[tuple[Path, list[str]]]) -> list[str]:
    """:data:`RUNNER` running ``jobs`` (status file, overrides after ``preset``'s) one after the
    other in one driver."""
    base = preset_overrides(preset) if preset else []
    return [sys.executable, "-c", RUNNER, "--each", json.dumps([(str(status), [*base, *o]) for status, o in jobs])]


def cli_command(preset: str, *overrides: str) -> list[str]:
    """``python -m repro.main_ppo -cn <preset> <overrides>``: the command line a user types."""
    return [sys.executable, "-m", "repro.main_ppo", "-cn", preset, *overrides]


def job_env(outputs: Path, ray_address: str | None = None, *, gpu: bool = False) -> dict[str, str]:
    """The job's environment: this checkout importable, its run folders under ``outputs``
    (``REPRO_OUTPUTS_DIR``), on a Ray cluster of its own unless ``ray_address`` is given.

    ``ray_address`` (the ``ray_head`` fixture) joins that cluster and keeps the ranks for the next
    job (``REPRO_REUSE_RANKS``): a job that tests what happens to its own Ray processes (kill -9,
    Ctrl-C, a lost rank) starts its own. ``gpu``: the job picks its accelerator itself."""
    env = dict(os.environ)
    # Packages may come through PYTHONPATH (the GPU machine's unpacked wheels): kept behind the checkout.
    env["PYTHONPATH"] = pythonpath(ROOT)
    if gpu:
        # The root conftest sets DS_ACCELERATOR=cpu for the CPU suites; an outputs root set by
        # whoever runs the gate is theirs (the cases name their folders with trainer.output_dir).
        env.pop("DS_ACCELERATOR", None)
        env.setdefault("REPRO_OUTPUTS_DIR", str(outputs))
    else:
        env["REPRO_OUTPUTS_DIR"] = str(outputs)
    if ray_address:
        env.update(RAY_ADDRESS=ray_address, REPRO_REUSE_RANKS="1")
    return env


def run(cmd: list[str], env: dict[str, str], *, timeout: float, log: Path | None = None,
        check: bool = True) -> subprocess.CompletedProcess:
    """Run ``cmd`` from the checkout's root; a run past ``timeout`` is killed (``TimeoutExpired``).

    Its output is captured (``.stdout``, ``.stderr``), or with ``log`` written to that file, stderr
    merged (a GPU case's log stays beside its outputs, and a long log never sits in memory).
    ``check``: a non-zero exit fails the test with the output's tail; without it, the caller
    asserts the exit status it expects."""
    if log is None:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        tail = f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    else:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as f:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
        tail = log.read_text()[-6000:]
    if check and proc.returncode != 0:
        pytest.fail(f"job failed with rc {proc.returncode}:\n{tail}")
    return proc


def run_job(preset: str, overrides: list[str], outputs: Path, *, ray_address: str | None = None,
            timeout: float = 240) -> subprocess.CompletedProcess:
    """One CPU job of ``preset`` with ``overrides`` through :data:`RUNNER`; it must exit 0."""
    return run(runner_command(preset, overrides), job_env(outputs, ray_address), timeout=timeout)


def start(cmd: list[str], env: dict[str, str], **popen) -> subprocess.Popen:
    """Start ``cmd`` in a session of its own (a test may signal its whole process group), its
    stdout and stderr merged into ``.stdout`` unless ``popen`` says otherwise."""
    kwargs = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "start_new_session": True}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, **(kwargs | popen))


def wait_for_checkpoint(proc: subprocess.Popen, run_dir: Path, step: int, timeout: float) -> None:
    """Until the job ``proc`` has marked its step-``step`` checkpoint in ``run_dir/checkpoints``
    committed (verl's marker, rewritten after each commit); fails if the job ends first or
    ``timeout`` passes."""
    marker = run_dir / "checkpoints" / MARKER
    deadline = time.time() + timeout
    while time.time() < deadline:
        if marker.is_file() and marker.read_text().strip() == str(step):
            return
        if proc.poll() is not None:
            out = proc.stdout.read()[-4000:] if proc.stdout else ""
            raise AssertionError(f"run ended (rc {proc.returncode}) before its step-{step} checkpoint:\n{out}")
        time.sleep(0.2)
    raise AssertionError(f"no step-{step} checkpoint ({marker}) within {timeout} s")


def job_processes(driver: int, outputs: Path) -> set[psutil.Process]:
    """The processes of the job whose driver is ``driver``: its descendants and every process running
    with its outputs folder (``REPRO_OUTPUTS_DIR``, :func:`job_env`: Ray's workers inherit it from the
    driver, though not its process tree), for :func:`alive`."""
    found: set[psutil.Process] = set()
    try:
        found.update(psutil.Process(driver).children(recursive=True))
    except psutil.NoSuchProcess:
        pass
    for p in psutil.process_iter():
        try:
            if p.environ().get("REPRO_OUTPUTS_DIR") == str(outputs) and p.pid != os.getpid():
                found.add(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def alive(procs: set[psutil.Process], wait_s: float) -> list[str]:
    """Those of ``procs`` (:func:`job_processes`) still running after up to ``wait_s`` seconds, as
    ``"<pid> <command line>"``: empty once every one has ended (a zombie counts as ended)."""
    deadline = time.time() + wait_s
    while True:
        running = []
        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    running.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
            except psutil.NoSuchProcess:
                continue
        if not running or time.time() > deadline:
            return running
        time.sleep(0.5)


class SharedRun:
    """One job that several tests read, run once per pytest session, across xdist workers.

    ``root`` is a folder every worker of the session sees (the session fixture passes the
    workers' common temp root). The first test to call :meth:`start` starts the job (on its own
    worker's Ray head, ``ray_address``) under a file lock, and a thread of that worker records the exit status
    when the job ends, whichever test is running then; later callers find it started. :meth:`rows`
    waits for that status from any worker and returns the job's metrics rows (failing with the
    log's tail if the job failed). Each test still runs its own interrupted or 2-node job against
    these rows, so a wrong resume or placement still fails it; what is shared is only a second
    copy of one deterministic run (the same command on the same machine is bitwise reproducible:
    scripts/goldens.py's docstring)."""

    def __init__(self, root: Path, preset: str, overrides: list[str], ray_address: str | None) -> None:
        self.root, self.preset, self.overrides, self.ray_address = root, preset, overrides, ray_address
        self.run_dir = root / "run"
        self._proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if (self.root / "started").exists():
                return
            (self.root / "started").write_text(str(os.getpid()))
        log = open(self.root / "log", "w")
        proc = self._proc = start(cli_command(self.preset, *self.overrides, f"trainer.output_dir={self.run_dir}"),
                                  job_env(self.root / "outputs", self.ray_address), stdout=log)

        def record_exit() -> None:
            rc = proc.wait()
            log.close()
            (self.root / "rc.tmp").write_text(str(rc))
            os.replace(self.root / "rc.tmp", self.root / "rc")  # readers see all of it or nothing

        threading.Thread(target=record_exit, daemon=True).start()

    def wait(self, timeout: float = 300) -> Path:
        """The job's run folder once it has ended with exit 0 (started by :meth:`start` here or on
        another worker); its console output (stdout and stderr) is :meth:`output`."""
        deadline = time.time() + timeout
        while not (self.root / "rc").exists():
            if time.time() > deadline:
                raise AssertionError(f"the shared run in {self.root} did not end within {timeout} s")
            time.sleep(0.2)
        rc = int((self.root / "rc").read_text())
        assert rc == 0, f"the shared run failed (rc {rc}):\n{self.output()[-6000:]}"
        return self.run_dir

    def rows(self, timeout: float = 300) -> list[dict]:
        """The job's metrics rows once it has ended."""
        return metrics(self.wait(timeout))

    def output(self) -> str:
        return (self.root / "log").read_text()

    def close(self, timeout: float = 300) -> None:
        """At the end of the session of the worker that started the job: it must not outlive that
        worker's Ray head (a test that failed before :meth:`rows` leaves it running)."""
        if self._proc is None:
            return
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, 9)
            self._proc.wait()


def metrics(run_dir: Path) -> list[dict]:
    """The rows of the run's ``metrics.tsv``, one per step (numbers as floats)."""
    return MetricsLog(run_dir / "metrics.tsv").rows


def summary(run_dir: Path) -> dict:
    """The run's ``summary.tsv`` (numbers as floats)."""
    return read_summary(run_dir / "summary.tsv")


def run_config(run_dir: Path) -> dict:
    """The run's whole resolved config as it wrote it (``config.yaml``; ``run.json`` keeps only the keys a resume
    must match, no rollout settings)."""
    import yaml

    return yaml.safe_load((run_dir / "config.yaml").read_text())


def with_vllm_engine(trainer_budget: dict, util: float, gpu_bytes: int) -> dict:
    """A GPU case's memory budget: the trainer's share (``fixtures/gpu_budgets.json``) plus 1.10 x vLLM's engine.
    vLLM sizes its pool from ``util`` x the GPU's memory, and the pool shows in torch's reserved figure (its
    allocator is torch's) and in NVML while awake; 1.10x the allowance as for the trainer's share: the allowance
    alone was exceeded by 0.75 GB on the tiny vLLM case's first run (2026-11-23), vLLM's buffers outside its
    KV-cache sizing. A fixed figure holds on one GPU model only: the 0.6B case reserved 24.73 GB on 2 H100s (80 GB)
    and 36.62 GB on 2 H200s (141 GB), the trainer's share the same (``results/seed_scale/README.md``, section 7)."""
    engine_gb = util * gpu_bytes / 2**30
    return {k: round(v + 1.10 * engine_gb, 2) for k, v in trainer_budget.items()}


def check_outputs(run_dir: Path, steps: int, required: tuple[str, ...]) -> list[dict]:
    """A finished CPU run of the tiny task: every output file, one row per step with every
    ``required`` metric finite (and every other float too), sane scores, lengths and timings, the
    summary agreeing with the rows. Returns the rows."""
    for name in ("metrics.tsv", "summary.tsv", "curves.png", "config.yaml", "train.log", "run.json"):
        assert (run_dir / name).is_file(), f"{name} missing in {run_dir}"
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for key in required:
        values = [r.get(key) for r in rows]
        assert all(isinstance(v, float) and math.isfinite(v) for v in values), f"{key}: {values}"
    for r in rows:
        for key, value in r.items():
            if isinstance(value, float):
                assert math.isfinite(value), f"step {r['step']}: {key}={value}"
        assert 0.0 <= r["critic/score/mean"] <= 1.0
        assert 1.0 <= r["response_length/mean"] <= 12.0
        assert r["perf/throughput"] > 0 and r["timing_s/step"] >= r["timing_s/gen"] > 0
    written = summary(run_dir)
    assert written["steps"] == steps and written["first_score"] == rows[0]["critic/score/mean"]
    assert (run_dir / "curves.png").read_bytes()[:4] == b"\x89PNG"
    return rows


def assert_same_metrics(a: list[dict], b: list[dict], names: tuple[str, str] = ("uninterrupted", "resumed")) -> None:
    """Rows ``a`` and ``b`` step by step (as many of each), every :data:`DETERMINISTIC` metric
    bitwise equal; a difference is named by step, metric and ``names``."""
    for ra, rb in zip(a, b, strict=True):
        for key in DETERMINISTIC:
            assert ra[key] == rb[key], f"step {ra['step']} {key}: {names[0]} {ra[key]} vs {names[1]} {rb[key]}"


class Gate:
    """A GPU gate case's record: named checks with their measured values, written to ``gate.json``
    (device, date, command, summary, checks) before they are asserted, so that a failed case
    still leaves its numbers for ``results/gpu_gate/``."""

    def __init__(self, case: str, out: Path, cmd: list[str]) -> None:
        self.case, self.out, self.cmd = case, out, cmd
        self.checks: list[dict] = []

    def check(self, name: str, ok: bool, measured: object, limit: object) -> None:
        self.checks.append({"check": name, "ok": bool(ok), "measured": measured, "limit": limit})

    def finish(self, summary: dict, extra: dict | None = None) -> None:
        record = {
            "case": self.case,
            "device": _device_name(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            # The runner's source is this module's, not the case's: the record shows its overrides.
            "command": " ".join(self.cmd[:2] + ["<runner>"] + self.cmd[3:]),
            "summary": summary,
            "checks": self.checks,
            **(extra or {}),
        }
        (self.out / "gate.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
        failed = [c for c in self.checks if not c["ok"]]
        assert not failed, f"{self.case}: failed checks {failed} (record in {self.out / 'gate.json'})"


def _device_name() -> str:
    import torch

    return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
