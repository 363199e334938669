"""repro's DeepSpeed workers as a verl engine (``model_engine=deepspeed``; install ``repro[verl]``).

Owns: the ``BaseEngine`` subclasses registered with verl for ``language_model`` and
``value_model``, backend ``deepspeed``, devices cuda and cpu (:mod:`.engine`); the engine and role
config dataclasses (:mod:`.config`), whose DeepSpeed keys are repro's own (:mod:`.engine_keys`, which
needs no verl and generates ``hydra_config/engine/deepspeed.yaml``); the micro-batch <-> model
adapter (:mod:`.model_io`); the engine's checkpoint folder (:mod:`.checkpointing`); and the Hydra
yamls verl's trainer composes (``hydra_config/``: ``model_engine/deepspeed.yaml`` and the actor, ref,
critic, engine, optim sections).

May import anything in repro below it (workers, ds_config, config, checkpoint_store, ...) and
verl; nothing in repro imports it, and repro's core environment never imports verl.

verl loads it through the ``verl.plugins`` entry point ``repro`` (pyproject.toml), which calls
:func:`register` when ``verl`` is imported.
"""

from __future__ import annotations

from pathlib import Path

HYDRA_CONFIG_DIR = Path(__file__).with_name("hydra_config")
SEARCHPATH = "pkg://repro.integrations.verl.hydra_config"
"""What to add to verl's Hydra search path: ``hydra.searchpath=[pkg://repro.integrations.verl.hydra_config]``."""


def register() -> None:
    """Register the DeepSpeed engines with verl's ``EngineRegistry`` (the entry point's target)."""
    from repro.integrations.verl.engine import register as _register

    _register()
