"""The cached composition (``repro.config.compose.compose``) returns what Hydra's own compose returns.

The reference is ``hydra_compose``: Hydra's compose API on the same ConfigStore, uncached, with no step of
repro's between. Compared: the YAML of the whole tree, each container's node type and the root's struct flag,
or, for a bad override, the exception's type, message and cause. Corpus: the lines ``load_config`` composes
for every preset and two of the PR's command lines, a list that changes every leaf key at once with group
selections among the values (and a value placed before the selection of its own group), and the
overrides Hydra refuses.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf

from repro.config import compose as compose_mod
from repro.config.compose import compose, hydra_compose
from repro.config.loader import CONFIG_GROUPS, CONFIG_NAMES, ConfigWarning, load_config, register_configs
from tests.pr_commands import all_pr_commands

GROUPS = tuple(CONFIG_GROUPS)
SHELL_VARS = {"DATA_TRAIN": "/nonexistent/train.parquet", "DATA_VAL": "/nonexistent/val.parquet",
              "BENCH_DIR": "/tmp/repro-bench"}
# Two PR commands: both groups selected by their older option names; ZeRO-3 with offload. The rest differ
# from them only in values (each Hydra compose here costs ~0.15 CPU s).
PR_CASES = ("older_form_aliases", "zero3_cpu_offload")
SELECT = ["actor@actor_rollout_ref.actor=ds_actor", "critic=ds_critic"]


def outcome(fn, config_name: str, lines: list[str]) -> tuple:
    try:
        cfg = fn(config_name, lines, GROUPS) if fn is compose else fn(config_name, lines)
    except Exception as e:  # the reference's failure is part of what must match
        return ("error", type(e).__name__, str(e), repr(e.__cause__))
    return ("ok", OmegaConf.to_yaml(cfg), OmegaConf.is_struct(cfg), _node_types(cfg, ""))


def _node_types(node: Any, path: str) -> list[tuple[str, str]]:
    out = [(path, f"{type(node).__name__}:{OmegaConf.get_type(node)}")]
    if isinstance(node, DictConfig):
        for key in node:
            child = node._get_node(key)
            if isinstance(child, (DictConfig, ListConfig)):
                out += _node_types(child, f"{path}.{key}")
    return out


def recorded_lines(monkeypatch) -> list[tuple[str, list[str]]]:
    """(config name, lines) as load_config hands them to the composer, for every preset and ``PR_CASES``."""
    calls: list[tuple[str, list[str]]] = []
    real = compose_mod.compose

    def record(config_name, lines, groups):
        calls.append((config_name, list(lines)))
        return real(config_name, lines, groups)

    monkeypatch.setattr(compose_mod, "compose", record)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        for name in CONFIG_NAMES:
            load_config(["trainer.dry_run=true"], config_name=name, environ={})
        for cmd in (c for c in all_pr_commands() if c.name in PR_CASES):
            load_config([*cmd.expanded(SHELL_VARS), "trainer.dry_run=true"], environ=dict(cmd.env))
    monkeypatch.undo()
    return calls


def every_leaf_changed() -> list[str]:
    """An override for each leaf key of the root config, each to a value unlike its default, with the group
    selections in the middle and ``critic.ppo_epochs`` before the selection of ``critic``."""
    register_configs()
    base = hydra_compose("ppo_trainer", [])
    lines: list[str] = []

    def walk(node: DictConfig, path: str) -> None:
        for key in node:
            child, full = node._get_node(key), f"{path}{key}"
            if isinstance(child, DictConfig):
                if OmegaConf.get_type(child) is not dict:  # an open dict takes new keys, not new values
                    walk(child, full + ".")
            elif isinstance(child, ListConfig):
                lines.append(f"{full}=[]")
            elif full != "critic.ppo_epochs" and not child._is_none() and not child._is_interpolation():
                value = node[key]
                if isinstance(value, bool):
                    lines.append(f"{full}={str(not value).lower()}")
                elif isinstance(value, (int, float)):
                    lines.append(f"{full}={value + 3}")
                elif isinstance(value, str):
                    lines.append(f"{full}=changed_{len(value)}")
                else:  # an enum: Hydra takes its name
                    lines.append(f"{full}={value.name}")

    walk(base, "")
    assert len(lines) > 150, len(lines)
    half = len(lines) // 2
    # trainer.nnodes set twice: the later value wins only if the order is kept.
    return ["critic.ppo_epochs=7", "trainer.nnodes=11", *lines[:half], *SELECT, *lines[half:]]


BAD = {
    "unknown key": ["no_such.key=1"],
    "wrong type": ["trainer.total_epochs=abc"],
    "a list for a number": ["trainer.total_epochs=[1,2]"],
    "unknown group option": ["critic=no_such_option"],
    "unknown option at a package": ["actor@actor_rollout_ref.actor=no_such_option"],
    "adding an existing key": ["+trainer.device=cpu"],
    "deleting a key": ["~trainer.device"],
    "a sweep": ["trainer.total_epochs=1,2"],
    "a value, then a bad value": ["trainer.total_epochs=2", "trainer.nnodes=x"],
}


def test_every_line_list_the_loader_composes_gives_hydras_config(monkeypatch):
    calls = recorded_lines(monkeypatch)
    assert len({tuple(lines) for _, lines in calls}) == len(CONFIG_NAMES) + len(PR_CASES)
    assert any(any(line.startswith("actor@") for line in lines) for _, lines in calls), "no group selection"
    for config_name, lines in calls:
        assert outcome(compose, config_name, lines) == outcome(hydra_compose, config_name, lines), lines


def test_a_dict_for_a_group_is_a_value_merged_into_its_section_as_in_hydra():
    lines = [*SELECT, "critic={ppo_epochs: 2}"]
    got = outcome(compose, "ppo_trainer", lines)
    assert got[0] == "ok" and "ppo_epochs: 2" in got[1].split("\ncritic:\n", 1)[1], got
    assert got == outcome(hydra_compose, "ppo_trainer", lines)


def test_every_leaf_key_changed_around_the_group_selections_gives_hydras_config():
    lines = every_leaf_changed()
    got = outcome(compose, "ppo_trainer", lines)
    assert got[0] == "ok", got
    assert got == outcome(hydra_compose, "ppo_trainer", lines)
    # The value set before its group's selection survives it, in Hydra and here.
    assert "ppo_epochs: 7" in got[1].split("\ncritic:\n", 1)[1]


@pytest.mark.parametrize("lines", BAD.values(), ids=BAD.keys())
def test_an_override_hydra_refuses_fails_with_hydras_error(lines):
    register_configs()
    expected = outcome(hydra_compose, "ppo_trainer", lines)
    assert expected[0] == "error", expected
    assert outcome(compose, "ppo_trainer", lines) == expected


def test_each_call_gets_its_own_tree_and_a_value_override_composes_nothing_new(monkeypatch):
    register_configs()
    first = compose("ppo_trainer", [*SELECT, "trainer.total_epochs=5"], GROUPS)
    first.trainer.nnodes = 9  # a caller changing its tree must not change the next caller's
    monkeypatch.setattr(compose_mod, "hydra_compose", lambda *a: pytest.fail("Hydra composed again"))
    second = compose("ppo_trainer", [*SELECT, "trainer.total_epochs=6"], GROUPS)
    assert (second.trainer.nnodes, second.trainer.total_epochs, first.trainer.total_epochs) == (1, 6, 5)
