"""Claiming the run folder, before the trainer and its heavy imports are loaded.

:func:`claim_run` picks the run folder (``repro.run.paths.choose_run_paths``), locks it
(``repro.run.lock``), checks that a resume continues the same run (``repro.run.resume``) and
records the config, with SIGTERM turned into ``KeyboardInterrupt`` for the whole block
(``repro.run.interrupts``). ``repro.main_ppo`` claims first, so a second launch or a changed config is
refused (``InputError``, exit 2) before torch, Ray and DeepSpeed are even imported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from repro.cluster.signals import terminate_as_interrupt
from repro.config import RunConfig
from repro.run.lock import RunLock, acquire
from repro.run.paths import RunPaths, choose_run_paths
from repro.run.resume import check_resume, record_config


@dataclass
class Claim:
    paths: RunPaths
    lock: RunLock
    changes: dict[str, tuple[Any, Any]]
    """Config changes allowed by ``trainer.allow_config_change`` (key -> (old, new))."""


@contextlib.contextmanager
def claim_run(cfg: RunConfig) -> Iterator[Claim]:
    """Hold the run folder of ``cfg`` for the block (module docstring); ``InputError`` if it cannot be."""
    paths = choose_run_paths(cfg)
    with acquire(paths.run_dir) as lock, terminate_as_interrupt():
        changes = check_resume(cfg, paths)
        record_config(cfg, paths, changes)  # as given (model.path=tiny), before the assets are resolved
        yield Claim(paths, lock, changes)
