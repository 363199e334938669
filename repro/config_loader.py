"""Command-line overrides -> a validated :class:`~repro.config.RunConfig`.

The dataclasses of ``repro.config`` are registered with Hydra's ConfigStore (primary config
``ppo_trainer``; groups ``actor`` and ``critic`` so that verl's ``actor@actor_rollout_ref.actor=ds_actor
critic=ds_critic`` select them) and composed with Hydra's compose API, which has none of
``@hydra.main``'s side effects (no output directory, no logging set-up, no chdir).

:func:`load_config` checks the overrides itself before composing, so that an unknown key gets
our message with close matches, then composes, converts to dataclasses (running every
``__post_init__``), validates the rules that span sections (batch plans, critic on/off,
rollout engine, sequence parallelism, offload, paths) and reads the DeepSpeed environment knobs
once. Problems are ``ValueError`` naming the full keys; harmless oddities are
:class:`ConfigWarning` warnings, one per key.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
import pathlib
import typing
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from repro import config as C
from repro.batching import ROLE_PREFIXES, plan_role_batch
from repro.config import NO_EFFECT_KEYS, ConfigFieldError, RunConfig, critic_enabled, ref_policy_used
from repro.ds_config import resolve_offload
from repro.presets import PRESETS

# `ppo_trainer` is the verl-shaped root; each preset is `ppo_trainer` plus its override list
# (command-line overrides come after it, so they win).
CONFIG_NAMES = ("ppo_trainer", *PRESETS)
# group -> (package it must be placed at, its options). Aliases keep older PR command lines working.
CONFIG_GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "actor": ("actor_rollout_ref.actor", ("ds_actor", "deepspeed_actor")),
    "critic": ("critic", ("ds_critic", "deepspeed_critic")),
}
KNOWN_LOGGERS = ("console", "file")
# Rollout keys that the vLLM rollout would use; they only warn as no-effect with the hf rollout.
_VLLM_KEYS_PREFIX = "actor_rollout_ref.rollout."


class ConfigWarning(UserWarning):
    """A setting that is accepted but ignored or suspicious; one per key."""


_registered = False


def register_configs() -> None:
    """Put the run config and its groups into Hydra's ConfigStore (idempotent)."""
    global _registered
    if _registered:
        return
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="ppo_trainer", node=RunConfig)
    for name in CONFIG_GROUPS["actor"][1]:
        store.store(group="actor", name=name, node=C.ActorConfig)
    for name in CONFIG_GROUPS["critic"][1]:
        store.store(group="critic", name=name, node=C.CriticConfig)
    _registered = True


def config_keys(root: type = RunConfig) -> tuple[frozenset[str], frozenset[str]]:
    """All dotted keys of the config tree (sections and leaves), and the open-dict keys under
    which any sub-key may be added (``reward.reward_kwargs``, ``ray_kwargs.ray_init``, ...)."""
    keys: set[str] = set()
    open_dicts: set[str] = set()

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name == "defaults":
                continue
            key = f"{prefix}{f.name}"
            keys.add(key)
            hint = hints[f.name]
            origin = typing.get_origin(hint)
            if dataclasses.is_dataclass(hint):
                walk(hint, key + ".")
            elif origin is dict:
                open_dicts.add(key)

    walk(root, "")
    return frozenset(keys), frozenset(open_dicts)


def close_matches(key: str, keys: Sequence[str] | frozenset[str], n: int = 3) -> list[str]:
    """Known keys that look like ``key``: difflib over full keys, then same leaf name elsewhere."""
    pool = sorted(keys)
    found = difflib.get_close_matches(key, pool, n=n, cutoff=0.6)
    leaf = key.rsplit(".", 1)[-1]
    found += [k for k in pool if k.rsplit(".", 1)[-1] == leaf and k not in found]
    return found[:n]


def check_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """Validate override strings against the config tree before Hydra sees them.

    Returns the overrides to compose (``+`` on an existing key and plain keys inside open
    dicts become ``++``; ``hydra.*`` keys are dropped) and warnings. Raises ``ValueError`` for
    unknown keys (with close matches), unknown groups or options, deletions and syntax errors.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    keys, open_dicts = config_keys()
    out: list[str] = []
    notes: list[str] = []
    parser = OverridesParser.create()
    for line in overrides:
        try:
            (ov,) = parser.parse_overrides([line])
        except HydraException as e:
            raise ValueError(f"cannot parse the override {line!r}: {_one_line(str(e))}") from None
        key = ov.key_or_group
        if key.startswith("hydra.") or key.startswith("hydra/"):
            notes.append(
                f"{key}: ignored; repro composes its config without Hydra's run directory or logging"
            )
            continue
        if ov.package is not None or (
            key in CONFIG_GROUPS and ov.type != OverrideType.ADD and "." not in key
        ):
            out.append(_check_group(ov, line))
            continue
        if ov.type == OverrideType.DEL:
            raise ValueError(f"{line!r}: deleting config keys is not supported; set {key} to a value instead")
        if key in keys:
            out.append("++" + line.lstrip("+") if ov.type == OverrideType.ADD else line)
            continue
        if any(key.startswith(d + ".") for d in open_dicts):
            out.append("++" + line.lstrip("+"))
            continue
        if key in CONFIG_GROUPS or "/" in key:
            raise ValueError(
                f"{line!r}: adding config groups is not supported; groups: "
                + ", ".join(f"{g}@{pkg}={'|'.join(opts)}" for g, (pkg, opts) in CONFIG_GROUPS.items())
            )
        matches = close_matches(key, keys | open_dicts)
        hint = f"; did you mean {' or '.join(matches)}?" if matches else "; no similar key exists"
        raise ValueError(f"unknown config key {key!r} (from {line!r}){hint}")
    return out, notes


def _check_group(ov: Any, line: str) -> str:
    group, package = ov.key_or_group, ov.package
    if group not in CONFIG_GROUPS:
        raise ValueError(
            f"{line!r}: unknown config group {group!r}; known groups: "
            + ", ".join(f"{g}@{pkg}" for g, (pkg, _) in CONFIG_GROUPS.items())
        )
    want_package, options = CONFIG_GROUPS[group]
    if (package or group) != want_package:
        form = f"{group}@{want_package}" if group != want_package else group
        raise ValueError(
            f"{line!r}: the {group!r} group is placed at {want_package}; write {form}={options[0]}"
        )
    value = ov.value()
    if value not in options:
        raise ValueError(
            f"{line!r}: {group}={value!r} is not an option of the {group!r} group; "
            f"choose one of {list(options)} (only DeepSpeed workers exist here)"
        )
    return line


def load_config(
    overrides: Sequence[str] = (), config_name: str = "ppo_trainer", environ: Mapping[str, str] | None = None
) -> RunConfig:
    """Compose ``config_name`` with ``overrides``, validate it and resolve the environment knobs.

    Warnings are issued as :class:`ConfigWarning`. ``environ`` defaults to ``os.environ``; it is
    read here, once.
    """
    if config_name not in CONFIG_NAMES:
        raise ValueError(f"config name {config_name!r} is not known; choose one of {list(CONFIG_NAMES)}")
    register_configs()
    environ = dict(os.environ) if environ is None else dict(environ)
    if config_name in PRESETS:
        overrides = [*PRESETS[config_name], *overrides]
        config_name = "ppo_trainer"
    lines, notes = check_overrides(list(overrides))
    lines, more = _deprecated_micro_keys(lines)
    notes += more
    composed = _compose(config_name, lines)
    cfg = _to_dataclasses(composed)
    notes += validate_run_config(cfg)
    for ds in (
        cfg.actor_rollout_ref.actor.deepspeed,
        cfg.critic.deepspeed_config,
        cfg.actor_rollout_ref.ref.deepspeed,
    ):
        C.resolve_env_knobs(ds, environ)
    fill_optimizer_steps(cfg)
    for note in notes:
        warnings.warn(note, ConfigWarning, stacklevel=2)
    return cfg


def _deprecated_micro_keys(lines: list[str]) -> tuple[list[str], list[str]]:
    """Setting the deprecated global ``ppo_micro_batch_size`` replaces the per-gpu default."""
    notes = []
    keys = {line.lstrip("+").split("=", 1)[0]: line.split("=", 1)[1] for line in lines if "=" in line}
    extra = []
    for prefix in ROLE_PREFIXES.values():
        old, new = f"{prefix}.ppo_micro_batch_size", f"{prefix}.ppo_micro_batch_size_per_gpu"
        if keys.get(old, "null") not in ("null", "None", "~") and new not in keys:
            extra.append(f"{new}=null")
            notes.append(f"{old} is deprecated (a global size divided by dp); use {new}")
    return lines + extra, notes


def _compose(config_name: str, lines: list[str]) -> Any:
    from hydra import compose, initialize
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    # A caller inside its own Hydra app (or a test using hydra.initialize) keeps its GlobalHydra:
    # set it aside while composing ours and put it back after.
    outer = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()
    try:
        with initialize(version_base="1.3", config_path=None):
            return compose(config_name=config_name, overrides=lines)
    except (HydraException, OmegaConfBaseException) as e:
        cause = e.__cause__
        if cause is None:
            raise ValueError(_one_line(str(e))) from None
        key = getattr(cause, "full_key", None)
        raise ValueError(f"{_one_line(str(e))}: {key + ': ' if key else ''}{_first_line(cause)}") from None
    finally:
        if outer is not None:
            GlobalHydra.instance().initialize(outer)


def _to_dataclasses(composed: Any) -> RunConfig:
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationResolutionError, OmegaConfBaseException

    try:
        cfg = OmegaConf.to_object(composed)
    except ConfigFieldError as e:
        raise ValueError(e.at(_locate_section(composed, "", e) or e.section)) from None
    except InterpolationResolutionError as e:
        raise ValueError(
            f"{e.full_key}: {_first_line(e)} (an unexpanded shell variable? export it, or pass "
            "the value itself)"
        ) from None
    except OmegaConfBaseException as e:
        raise ValueError(f"{getattr(e, 'full_key', '')}: {_first_line(e)}") from None
    assert isinstance(cfg, RunConfig)
    return cfg


def _locate_section(node: Any, path: str, err: ConfigFieldError) -> str | None:
    """The dotted path of the (deepest) section whose ``__post_init__`` raised ``err``."""
    from omegaconf import DictConfig, OmegaConf

    for key in node:
        child = node._get_node(key)
        if isinstance(child, DictConfig) and dataclasses.is_dataclass(OmegaConf.get_type(child)):
            found = _locate_section(child, f"{path}.{key}" if path else str(key), err)
            if found:
                return found
    cls = OmegaConf.get_type(node)
    if cls is not None and cls.__name__ == err.section:
        try:
            OmegaConf.to_object(node)
        except ConfigFieldError as inner:
            if (inner.field_name, inner.detail) == (err.field_name, err.detail):
                return path
    return None


def _first_line(e: BaseException) -> str:
    """OmegaConf messages continue with full_key/reference_type lines; the key is named by the caller."""
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _one_line(text: str) -> str:
    return "; ".join(part.strip() for part in str(text).strip().splitlines() if part.strip())


def validate_run_config(cfg: RunConfig) -> list[str]:
    """Rules that span sections; raises ``ValueError`` naming keys, returns warnings."""
    notes: list[str] = []
    dry = cfg.trainer.dry_run
    arr = cfg.actor_rollout_ref
    use_critic = critic_enabled(cfg)

    sps = {arr.actor.ulysses_sequence_parallel_size, cfg.critic.ulysses_sequence_parallel_size if use_critic else 1}
    if len(sps - {1}) > 1:
        # DeepSpeed's SP groups (parallel_state_sp) are process-wide: one SP size per process.
        raise ValueError(
            f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={arr.actor.ulysses_sequence_parallel_size} and "
            f"critic.ulysses_sequence_parallel_size={cfg.critic.ulysses_sequence_parallel_size}: roles that use "
            "sequence parallelism must use the same size (or 1)"
        )

    if use_critic and cfg.critic.model.lora_rank:
        raise ValueError(f"critic.model.lora_rank={cfg.critic.model.lora_rank}: LoRA is implemented for the "
                         "actor only (actor_rollout_ref.model.lora_rank); set critic.model.lora_rank=0")

    if cfg.algorithm.adv_estimator == "gae" and cfg.critic.enable is False:
        raise ValueError(
            "algorithm.adv_estimator=gae needs a critic but critic.enable=False; "
            "set critic.enable=True or algorithm.adv_estimator=grpo"
        )
    if cfg.algorithm.adv_estimator == "grpo" and cfg.critic.enable:
        notes.append(
            "critic.enable=True with algorithm.adv_estimator=grpo: the critic is trained but GRPO "
            "advantages do not use its values"
        )
    if cfg.algorithm.adv_estimator == "grpo_passk" and arr.rollout.n < 2:
        raise ValueError(
            f"algorithm.adv_estimator=grpo_passk needs actor_rollout_ref.rollout.n >= 2 (it compares the best "
            f"two samples of each prompt), got {arr.rollout.n}"
        )
    if cfg.algorithm.adv_estimator == "grpo" and arr.rollout.n == 1:
        notes.append(
            "actor_rollout_ref.rollout.n=1 with algorithm.adv_estimator=grpo: each group has one "
            "sample, so (as in verl) its advantage is its raw score, without a baseline; use rollout.n >= 2"
        )

    for role in ("actor", "critic") if use_critic else ("actor",):
        plan_role_batch(cfg, role)

    check_inactive_skip(cfg, cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes)

    if arr.rollout.name == "hf" and arr.rollout.tensor_model_parallel_size != 1:
        raise ValueError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={arr.rollout.tensor_model_parallel_size}"
            " needs the vllm rollout; the hf rollout runs one replica per rank: set it to 1"
        )
    if arr.rollout.name == "vllm" and importlib.util.find_spec("vllm") is None:
        msg = (
            "actor_rollout_ref.rollout.name=vllm needs the vllm package (pip install 'repro[vllm]'), "
            "which is not installed; use actor_rollout_ref.rollout.name=hf"
        )
        if not dry:
            raise ValueError(msg)
        notes.append(msg + " (a real run fails here)")

    sections = [("actor_rollout_ref.actor.deepspeed", arr.actor.deepspeed)]
    if use_critic:
        sections.append(("critic.deepspeed_config", cfg.critic.deepspeed_config))
    if ref_policy_used(cfg):
        sections.append(("actor_rollout_ref.ref.deepspeed", arr.ref.deepspeed))
    for path, ds in sections:
        resolve_offload(ds.zero_stage, ds.offload, bool(ds.param_offload), ds.offload_dir, key=path)

    if cfg.trainer.resume_mode == "resume_path" and not cfg.trainer.resume_from_path:
        raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
    for name in cfg.trainer.logger:
        if name not in KNOWN_LOGGERS:
            notes.append(f"trainer.logger: {name!r} is ignored; repro logs to {list(KNOWN_LOGGERS)}")

    notes += _check_paths(cfg, use_critic, dry)
    notes += _no_effect_notes(cfg)
    return notes


def _check_paths(cfg: RunConfig, use_critic: bool, dry: bool) -> list[str]:
    """Model and data paths must exist for a real run; a dry run only warns (it loads nothing)."""
    problems = []
    models = [("actor_rollout_ref.model", cfg.actor_rollout_ref.model)]
    if use_critic:
        models.append(("critic.model", cfg.critic.model))
    for path, model in models:
        if model.path != "tiny" and not pathlib.Path(model.path).is_dir():
            problems.append(
                f"{path}.path={model.path!r} is not a local directory (models are not downloaded "
                "here; use a local Hugging Face model directory or 'tiny')"
            )
        if model.tokenizer_path and not pathlib.Path(model.tokenizer_path).is_dir():
            problems.append(f"{path}.tokenizer_path={model.tokenizer_path!r} is not a local directory")
    for key in ("train_files", "val_files"):
        value = getattr(cfg.data, key)
        files = [] if value is None else [value] if isinstance(value, str) else list(value)
        for f in files:
            if not pathlib.Path(str(f)).is_file():
                problems.append(
                    f"data.{key}: {str(f)!r} does not exist (leave it unset for the built-in arithmetic task)"
                )
    if problems and not dry:
        raise ValueError("; ".join(problems))
    return [p + " (a real run fails here)" for p in problems]


def _no_effect_notes(cfg: RunConfig) -> list[str]:
    defaults = RunConfig()
    notes = []
    for key, why in NO_EFFECT_KEYS.items():
        if cfg.actor_rollout_ref.rollout.name == "vllm" and key.startswith(_VLLM_KEYS_PREFIX):
            continue
        if _get(cfg, key) != _get(defaults, key):
            notes.append(f"{key}={_get(cfg, key)!r} has no effect here: {why}")
    return notes


def _get(obj: Any, key: str) -> Any:
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def check_inactive_skip(cfg: RunConfig, world_size: int) -> bool:
    """Whether the inactive-micro-batch shortcut is on; refuses it in multi-rank data parallel.

    Skipping backward for a micro-batch with no response tokens is a rank-local decision, so
    ranks stop issuing the same collectives: in the historical ZeRO-2 hang rank 0 skipped its
    backward and entered a 1-element all_reduce (the overflow check in ``step()``) while rank 1
    was in a 440467456-element gradient all_reduce of its backward. The driver checks the
    configured world size; each actor checks the one it really has.
    """
    actor = cfg.actor_rollout_ref.actor
    if not actor.skip_inactive_micro_batches:
        return False
    if world_size > 1 and not actor.unsafe_allow_skip_in_data_parallel:
        raise ValueError(
            f"actor_rollout_ref.actor.skip_inactive_micro_batches=True with {world_size} data-parallel ranks: "
            "a rank that skips a micro-batch's backward issues different collectives from its peers "
            "(the ZeRO-2 hang: rank 0 in a 1-element all_reduce, rank 1 in a 440467456-element gradient "
            "all_reduce). It is allowed only at world size 1; set "
            "actor_rollout_ref.actor.unsafe_allow_skip_in_data_parallel=True only to reproduce that hang."
        )
    return True


def fill_optimizer_steps(cfg: RunConfig, rl_steps: int | None = None) -> None:
    """LR-schedule optimizer steps = RL steps x ppo_epochs x mini-batches per step, unless set.

    ``rl_steps`` defaults to ``trainer.total_training_steps``; the trainer passes the count it
    derives from the data when that key is unset.
    """
    steps = cfg.trainer.total_training_steps if rl_steps is None else rl_steps
    if steps is None:
        return
    roles = [("actor", cfg.actor_rollout_ref.actor)]
    if critic_enabled(cfg):
        roles.append(("critic", cfg.critic))
    for role, section in roles:
        if section.optim.total_training_steps <= 0:
            plan = plan_role_batch(cfg, role)
            section.optim.total_training_steps = steps * section.ppo_epochs * plan.num_mini_batches
