"""Hydra's composition of a config name and its overrides, cached per process by the group selection.

Hydra composes every call from scratch: it builds the defaults list, loads its own ``hydra`` node (launcher,
sweeper, logging: most of the work) and merges, about 0.15 CPU s a call, of which copying repro's own tree is
0.01 s. A process that loads many configs (the unit suite: 174 calls, 42 s of its two workers' time) paid that
each time. Here Hydra composes the config name with the overrides that select config groups
(``critic=ds_critic``, ``actor@actor_rollout_ref.actor=ds_actor``), once per process; every call then
gets a deep copy of that composition with its value overrides (``key=value``, ``+key=value``, ``~key``)
applied by Hydra's own function, in their order, as Hydra applies them after composing.

That is Hydra's result by construction, and ``tests/unit/config/test_compose.py`` holds it to a plain
Hydra compose, values, node types and error messages, over the presets, two of the PR's command lines and
every leaf key. Overrides Hydra treats otherwise (``hydra.*``, sweeps) take Hydra's own path, uncached.

Imports: hydra and omegaconf only (the ConfigStore is filled by ``repro.config.loader.register_configs``
before the first call, and not changed after it).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

_BASES: dict[tuple[str, tuple[str, ...]], Any] = {}
"""(config name, group overrides) -> the composed config before value overrides, never handed out itself."""


def compose(config_name: str, lines: Sequence[str], groups: Sequence[str]) -> Any:
    """The DictConfig that ``hydra.compose(config_name, lines)`` returns; ``groups``: the ConfigStore's config
    groups (an override of one of them, with a non-dict value, changes the defaults list, as Hydra decides)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides=list(lines))
    if any(o.is_hydra_override() or o.is_sweep_override() for o in parsed):
        return hydra_compose(config_name, lines)
    selects = [o.key_or_group in groups and not isinstance(o.value(), dict) for o in parsed]
    key = (config_name, tuple(o.input_line for o, s in zip(parsed, selects, strict=True) if s))
    if key not in _BASES:
        _BASES[key] = hydra_compose(config_name, list(key[1]))
    cfg = copy.deepcopy(_BASES[key])
    # Hydra's own step, errors included (it wraps each OmegaConf error in a ConfigCompositionException).
    ConfigLoaderImpl._apply_overrides_to_config([o for o, s in zip(parsed, selects, strict=True) if not s], cfg)
    return cfg


def hydra_compose(config_name: str, lines: Sequence[str]) -> Any:
    """Hydra's own compose of the ConfigStore's ``config_name``. A caller inside its own Hydra app (or a test using
    ``hydra.initialize``) keeps its GlobalHydra: it is set aside while composing and put back after."""
    from hydra import compose as _compose
    from hydra import initialize
    from hydra.core.global_hydra import GlobalHydra

    outer = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()
    try:
        with initialize(version_base="1.3", config_path=None):
            return _compose(config_name=config_name, overrides=list(lines))
    finally:
        if outer is not None:
            GlobalHydra.instance().initialize(outer)
