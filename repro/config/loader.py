"""Command-line overrides -> a validated :class:`~repro.config.RunConfig`.

The dataclasses of ``repro.config`` are registered with Hydra's ConfigStore (primary config
``ppo_trainer``; groups ``actor`` and ``critic`` so that verl's ``actor@actor_rollout_ref.actor=ds_actor
critic=ds_critic`` select them) and composed with Hydra's compose API, which has none of
``@hydra.main``'s side effects (no output directory, no logging set-up, no chdir), through
:mod:`repro.config.compose`, which composes each group selection once per process.

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
import os
import typing
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from repro import config as C
from repro.batching.plan import ROLE_PREFIXES
from repro.config import ConfigFieldError, RunConfig
from repro.config.presets import PRESETS
from repro.config.rules import fill_optimizer_steps, validate_run_config

# `ppo_trainer` is the verl-shaped root; each preset is `ppo_trainer` plus its override list
# (command-line overrides come after it, so they win).
CONFIG_NAMES = ("ppo_trainer", *PRESETS)
# group -> (package it must be placed at, its options). Aliases keep older PR command lines working.
CONFIG_GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "actor": ("actor_rollout_ref.actor", ("ds_actor", "deepspeed_actor")),
    "critic": ("critic", ("ds_critic", "deepspeed_critic")),
}


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
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from repro.config.compose import compose

    try:
        return compose(config_name, lines, tuple(CONFIG_GROUPS))
    except (HydraException, OmegaConfBaseException) as e:
        cause = e.__cause__
        if cause is None:
            raise ValueError(_one_line(str(e))) from None
        key = getattr(cause, "full_key", None)
        raise ValueError(f"{_one_line(str(e))}: {key + ': ' if key else ''}{_first_line(cause)}") from None


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
