"""Resume only the same run: the result-changing config of a run folder must match the command's.

A run records its config in ``run.json`` when it starts (``config``: every key that can change what
the run computes, flattened; ``config_digest``: a digest of it). Before a run continues a folder
(``trainer.resume_mode=auto``) or a checkpoint (``resume_path``), :func:`check_resume` compares
the command's config with the recorded one, before any worker starts:

- equal: go on;
- different, ``auto``: :class:`~repro.run.preflight.InputError` (exit 2) listing every changed key with
  both values and the three ways on (a new ``trainer.experiment_name``,
  ``trainer.resume_mode=disable``, or ``resume_path`` with ``trainer.allow_config_change``);
- different, ``resume_path``: allowed only for the keys listed in ``trainer.allow_config_change``;
  the changes are recorded in the new run's ``run.json`` (``config_changes``) and ``train.log``.

``IGNORED`` is the one list of keys that may differ between the pieces of one run: how long it
runs, how often it saves and validates, where and how it logs and writes. Keys without effect
(``repro.config.NO_EFFECT_KEYS``) are ignored too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from repro.config import NO_EFFECT_KEYS, RunConfig
from repro.run.paths import RUN_STATE, RunPaths, run_state, write_run_state
from repro.run.preflight import InputError

IGNORED: tuple[str, ...] = (
    "trainer.total_training_steps",
    "trainer.total_epochs",
    "*.optim.total_training_steps",  # derived from trainer.total_training_steps when left unset
    "trainer.save_freq",
    "trainer.test_freq",
    "trainer.val_before_train",
    "trainer.logger",
    "trainer.progress",
    "trainer.profile_steps",
    "trainer.project_name",
    "trainer.experiment_name",
    "trainer.output_dir",
    "trainer.default_local_dir",
    "trainer.resume_mode",
    "trainer.resume_from_path",
    "trainer.allow_config_change",
    "trainer.max_actor_ckpt_to_keep",
    "trainer.max_critic_ckpt_to_keep",
    "trainer.dry_run",
    "trainer.ray_address",
    "ray_kwargs.*",
    *NO_EFFECT_KEYS,
)


def _flatten(obj: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(obj, dict) and obj:
        for k, v in obj.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = json.loads(json.dumps(obj, default=str))


def is_ignored(key: str) -> bool:
    return any(fnmatch(key, pattern) for pattern in IGNORED)


def result_config(cfg: RunConfig) -> dict[str, Any]:
    """The result-changing keys of ``cfg`` and their values (JSON values), flattened."""
    tree = dataclasses.asdict(cfg)
    tree.pop("defaults", None)
    flat: dict[str, Any] = {}
    _flatten(tree, "", flat)
    return {k: v for k, v in sorted(flat.items()) if not is_ignored(k)}


def digest(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """key -> (old, new) for every key whose value differs (a missing key reads as ``<unset>``)."""
    keys = sorted(set(old) | set(new))
    return {k: (old.get(k, "<unset>"), new.get(k, "<unset>")) for k in keys if old.get(k, "<unset>") != new.get(k, "<unset>")}


def _source_run_dir(checkpoint: Path) -> Path | None:
    """The run folder a checkpoint belongs to: the nearest ancestor holding ``run.json``."""
    for parent in list(checkpoint.resolve().parents)[:3]:
        if (parent / RUN_STATE).is_file():
            return parent
    return None


def _show(changes: dict[str, tuple[Any, Any]]) -> str:
    return "; ".join(f"{k}: {json.dumps(a)} -> {json.dumps(b)}" for k, (a, b) in changes.items())


def check_resume(cfg: RunConfig, paths: RunPaths) -> dict[str, tuple[Any, Any]]:
    """Refuse a resume whose config differs from the recorded one (module docstring).

    Returns the allowed changes (empty unless ``resume_path`` with ``allow_config_change``).
    """
    t = cfg.trainer
    for key in t.allow_config_change:
        if is_ignored(key):
            raise InputError(f"trainer.allow_config_change: {key} may change between resumes anyway; drop it")
        if not any(k == key or k.startswith(key + ".") for k in result_config(cfg)):
            raise InputError(f"trainer.allow_config_change: {key!r} is not a config key")
    if paths.resumed_from is None:
        return {}
    source = paths.run_dir if t.resume_mode == "auto" else _source_run_dir(paths.resumed_from)
    recorded = run_state(source).get("config") if source is not None else None
    if recorded is None:
        if t.resume_mode == "auto":
            raise InputError(
                f"{paths.run_dir} records no config in {RUN_STATE}, so it cannot be told to be the same run; "
                "start a new one with trainer.resume_mode=disable, or continue it with trainer.resume_mode=resume_path "
                f"trainer.resume_from_path={paths.resumed_from}"
            )
        return {}
    changes = diff(recorded, result_config(cfg))
    allowed = {k: v for k, v in changes.items()
               if any(k == a or k.startswith(a + ".") for a in t.allow_config_change)}
    refused = {k: v for k, v in changes.items() if k not in allowed}
    if not refused:
        return allowed
    keys = ",".join(refused)
    raise InputError(
        f"{'run folder ' + str(paths.run_dir) if t.resume_mode == 'auto' else 'checkpoint ' + str(paths.resumed_from)}"
        f" was made with a different config: {_show(refused)}. Resuming would mix two configurations. To go on: "
        "a new trainer.experiment_name=..., or trainer.resume_mode=disable (a fresh run), or continue on purpose "
        f"with trainer.resume_mode=resume_path trainer.resume_from_path={paths.resumed_from} "
        f"trainer.allow_config_change=[{keys}]"
    )


def record_config(cfg: RunConfig, paths: RunPaths, changes: dict[str, tuple[Any, Any]]) -> None:
    """Write the run's config (and any allowed changes, appended) to ``run.json``."""
    config = result_config(cfg)
    fields: dict[str, Any] = {"config": config, "config_digest": digest(config)}
    if changes:
        history = list(run_state(paths.run_dir).get("config_changes", []))
        history.append({"resumed_from": str(paths.resumed_from), "step": paths.resume_step,
                        "changed": {k: {"old": a, "new": b} for k, (a, b) in changes.items()}})
        fields["config_changes"] = history
    write_run_state(paths.run_dir, **fields)


def describe_changes(changes: dict[str, tuple[Any, Any]]) -> str:
    """One line for ``train.log``."""
    return f"config changed on purpose (trainer.allow_config_change): {_show(changes)}"
