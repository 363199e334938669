"""Entry point: ``python -m repro.main_ppo -cn ppo_trainer key=value ...`` (verl's command line).

The config is built by :func:`repro.config.loader.load_config` (Hydra compose; no ``@hydra.main``
side effects). With ``trainer.dry_run=true`` nothing starts: the effective plan is printed and
the last line of stdout is one JSON object (DeepSpeed config per role, batch split, env knobs,
warnings). Otherwise :func:`repro.trainer.run` runs the job. A bad config exits with status 2
and a one-paragraph message naming the keys, without a traceback.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Sequence

USAGE = """usage: python -m repro.main_ppo [-cn NAME | --config-name NAME] [key=value ...]

PPO / GRPO with DeepSpeed workers on Ray, configured with verl's keys (Hydra overrides).

configs (-cn):
  grpo_tiny     the embedded default job: GRPO of a 1 M-parameter Qwen3 on 2+1-digit addition,
                2 ranks, ZeRO-2, 60 steps (about 3 minutes on 2 CPU cores)
  ppo_tiny      the same task with a critic and GAE
  grpo_0p6b     the seed's GRPO command at its scale: a Qwen3-0.6B-shaped policy (built on a GPU the
                first time), 2 GPUs, vLLM rollout, ZeRO-2, 60 steps (about 6 s a step on 2 H100s)
  ppo_trainer   verl's defaults (the default): give actor_rollout_ref.model.path and data.*_files;
                without them it trains the built-in tiny policy on the arithmetic task (the
                banner and the dry run name the model and data in use)

common keys:
  trainer.device=auto|cpu|cuda      auto (default): GPU ranks when CUDA is visible, else CPU ranks
  trainer.n_gpus_per_node=N trainer.nnodes=M   ranks per node, nodes (nnodes>1: trainer.ray_address)
  actor_rollout_ref.actor.deepspeed.zero_stage=1|2|3 actor_rollout_ref.actor.deepspeed.offload=cpu
  trainer.dry_run=true              check, print the effective plan (last line: JSON), start nothing
  trainer.resume_mode=auto|disable  auto (default): the same command continues its unfinished run
  reward.custom_reward_function.path=FILE [.name=compute_score]  verl's reward plug-in,
        compute_score(data_source, solution_str, ground_truth, extra_info) -> float

outputs: outputs/<experiment_name>_<timestamp>/ (or trainer.output_dir; root $REPRO_OUTPUTS_DIR):
  metrics.tsv summary.tsv curves.png config.yaml train.log run.json checkpoints/
cache: the tiny policy and the arithmetic data are built once, in $REPRO_CACHE_DIR (~/.cache/repro)

on GPUs: trainer.device=cuda trainer.n_gpus_per_node=<GPUs>. The GPU gate (2 CUDA GPUs; the vLLM
cases 1): REPRO_GPU_PYTHON=python3 bash scripts/gpu_e2e.sh  (or nox -s gpu_e2e in a CUDA env)
cleanup after a kill -9: python -m repro.cluster.ray_reaper (every run also does it first)
more: README.md and docs/ (docs/config.md: keys and batch split; docs/running.md: runs on disk)"""

_IGNORED_FLAGS = ("-cp", "--config-path", "-cd", "--config-dir")


def parse_argv(argv: Sequence[str]) -> tuple[str, list[str], list[str]]:
    """(config name, overrides, notes) from the command line; ``ValueError`` for what we do not take."""
    config_name = "ppo_trainer"
    overrides: list[str] = []
    notes: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        flag, eq, inline = arg.partition("=") if arg.startswith("-") else (arg, "", "")
        if flag in ("-cn", "--config-name") + _IGNORED_FLAGS:
            if eq:
                value = inline
            elif i + 1 < len(args):
                i += 1
                value = args[i]
            else:
                raise ValueError(f"{flag} needs a value")
            if flag in ("-cn", "--config-name"):
                config_name = value
            else:
                notes.append(f"{flag} {value}: ignored; the configs are built into repro (ConfigStore)")
        elif arg.startswith("-"):
            raise ValueError(
                f"unknown option {arg!r}; only -cn/--config-name and key=value overrides are accepted"
            )
        else:
            overrides.append(arg)
        i += 1
    return config_name, overrides, notes


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    if not any(a.replace(" ", "").lower() in ("trainer.dry_run=true", "trainer.dry_run=1") for a in argv):
        # The first line within a second of start: the checks and Ray's start-up take a while.
        print("repro: reading the config and checking the inputs (model, data, reward) before anything starts",
              flush=True)
    from repro.config.loader import ConfigWarning, load_config
    from repro.run.preflight import InputError, preflight

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConfigWarning)
            config_name, overrides, notes = parse_argv(argv)
            cfg = load_config(overrides, config_name=config_name)
            notes += preflight(cfg, dry=cfg.trainer.dry_run)
            plan = None
            if cfg.trainer.dry_run:
                from repro.config.plan import effective_plan

                plan = effective_plan(cfg)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    notes += [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    for w in caught:
        if not issubclass(w.category, ConfigWarning):
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)

    if plan is not None:
        from repro.config.plan import plan_summary

        plan["warnings"] = notes + plan["warnings"]
        from repro.run.banner import inputs_lines

        print(f"repro dry run of {config_name!r}: nothing is started")
        for line in inputs_lines(cfg):
            print(line)
        for line in plan_summary(plan):
            print(line)
        print(json.dumps(plan, sort_keys=True))
        return 0

    from repro.cluster.errors import WorkerError
    from repro.cluster.placement import NodeLostError, PlacementError
    from repro.run.claim import claim_run
    from repro.run.interrupts import INTERRUPTED_EXIT

    try:
        with claim_run(cfg) as claim:  # a live holder or a changed config: refused before the heavy imports
            from repro.run.banner import inputs_lines

            t = cfg.trainer
            print(f"repro: starting {config_name!r}: importing torch, DeepSpeed and Ray, then Ray and "
                  f"{t.n_gpus_per_node * t.nnodes} rank(s) (tens of seconds on a small machine; a built-in "
                  "policy or the arithmetic data not yet cached is built first, a minute or more)", flush=True)
            for line in inputs_lines(cfg):
                print(line, flush=True)
            from repro import trainer  # the trainer pulls in Ray and torch; keep dry runs light

            out_dir = trainer.run(cfg, claim)
    except (InputError, PlacementError) as e:  # the inputs or the cluster cannot hold the run as configured
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (WorkerError, NodeLostError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return INTERRUPTED_EXIT  # the trainer logged where the run stands and how to resume
    print(f"output: {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
