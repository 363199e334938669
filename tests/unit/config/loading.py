"""Loading configs the way the config tests do: the loader's warnings collected, dry runs of the
seed PR's command lines (built once per session).

Shared by ``test_config.py`` and ``test_pr_commands.py``; it lives here because test modules never
import each other (``tests/unit/test_test_layout.py``).
"""

from __future__ import annotations

import warnings

from repro.config import RunConfig
from repro.config.loader import ConfigWarning, load_config
from tests.pr_commands import all_pr_commands

PR_COMMANDS = all_pr_commands()
# A dry run only warns about missing models and data, so the fixtures' paths need not exist.
SHELL_VARS = {
    "DATA_TRAIN": "/nonexistent/train.parquet",
    "DATA_VAL": "/nonexistent/val.parquet",
    "BENCH_DIR": "/tmp/repro-bench",
}
ZERO3 = next(c for c in PR_COMMANDS if c.name == "zero3_cpu_offload")


_BUILT: dict[str, tuple[RunConfig, list[str]]] = {}


def built(cmd):
    """The dry-run config of a PR command (built once per test session)."""
    if cmd.name not in _BUILT:
        _BUILT[cmd.name] = dry(cmd.expanded(SHELL_VARS), cmd.env)
    return _BUILT[cmd.name]


def load(overrides, environ=None, config_name="ppo_trainer"):
    """load_config, returning (cfg, warning messages)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        cfg = load_config(list(overrides), config_name=config_name, environ={} if environ is None else environ)
    return cfg, [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]


def dry(overrides, environ=None):
    return load([*overrides, "trainer.dry_run=true"], environ)
