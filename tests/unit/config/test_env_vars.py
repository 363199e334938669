"""docs/config.md's table of environment variables is complete: every REPRO_*/VERL_* name read is a row.

The names read come from the code itself: in ``repro/`` every string constant that is a whole
variable name (``os.environ.get("REPRO_X")``, ``ENV_X = "REPRO_X"``; a docstring that mentions one
does not count), and in the scripts, ``noxfile.py``, ``conftest.py``, the GPU gate and the CI workflow
every name in the text. A row nobody reads fails too, and a row's config key must exist.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re

from repro.config import ENV_KNOBS, DeepSpeedConfig
from repro.config.fields import field_docs
from repro.config.loader import config_keys

ROOT = pathlib.Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "config.md"
NAME = re.compile(r"\b(?:REPRO|VERL)_[A-Z0-9][A-Z0-9_]*\b")
HEADING = "## Environment variables"
OUTSIDE = ["scripts/**/*", "noxfile.py", "conftest.py", "tests/gpu_e2e/*.py", ".github/workflows/*.yml", ".ci/*"]
"""Where the scripts, sessions and the GPU gate read their variables (tests/ elsewhere only sets made-up ones)."""


def table(text: str) -> dict[str, list[str]]:
    """variable -> its row's cells, from the table under HEADING."""
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"`([A-Z0-9_]+)`", cells[0]) if line.startswith("|") else None
        if m:
            rows[m.group(1)] = cells
    return rows


def read_in_repro() -> dict[str, str]:
    """Each variable name spelled whole as a string in repro/ -> the first file that does."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / "repro").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.fullmatch(node.value):
                found.setdefault(node.value, str(path.relative_to(ROOT)))
    return found


def read_outside() -> dict[str, str]:
    found: dict[str, str] = {}
    for pattern in OUTSIDE:
        for path in sorted(ROOT.glob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts:
                for name in NAME.findall(path.read_text(errors="replace")):
                    if not name.endswith("_"):  # "the VERL_DS_* knobs": a prefix, not a variable
                        found.setdefault(name, str(path.relative_to(ROOT)))
    return found


def missing(read: dict[str, str], rows: dict[str, list[str]]) -> list[str]:
    return [f"{name} (read in {where})" for name, where in sorted(read.items()) if name not in rows]


def test_every_variable_read_in_repro_is_in_the_table() -> None:
    rows = table(DOC.read_text())
    assert len(rows) >= 20, "the table under '## Environment variables' in docs/config.md was not found"
    gone = missing(read_in_repro(), rows)
    assert not gone, "add a row to docs/config.md's environment-variable table for: " + ", ".join(gone)


def test_every_variable_the_scripts_and_sessions_read_is_in_the_table() -> None:
    gone = missing(read_outside(), table(DOC.read_text()))
    assert not gone, "add a row to docs/config.md's environment-variable table for: " + ", ".join(gone)


def test_every_row_is_read_somewhere() -> None:
    read = {**read_outside(), **read_in_repro()}
    stale = sorted(set(table(DOC.read_text())) - set(read))
    assert not stale, f"rows of docs/config.md's environment-variable table that nothing reads: {stale}"


def test_a_variable_that_duplicates_a_key_is_that_keys_default() -> None:
    """Each DeepSpeed knob's row names its key; the key's default is None (read the variable), and
    the key's own doc names the variable."""
    rows = table(DOC.read_text())
    defaults = {f.name: f.default for f in dataclasses.fields(DeepSpeedConfig)}
    docs = field_docs(DeepSpeedConfig)
    for env, key in ENV_KNOBS.items():
        assert f"`deepspeed.{key}`" in rows[env][2], (env, rows[env][2])
        assert defaults[key] is None and env in docs[key], (key, defaults[key], docs[key])


def test_the_keys_named_in_the_table_exist() -> None:
    keys, _ = config_keys()
    ds_keys = {f"deepspeed.{f.name}" for f in dataclasses.fields(DeepSpeedConfig)}
    for name, cells in table(DOC.read_text()).items():
        for token in re.findall(r"`([a-z_.]+\.[a-z_]+)`", cells[2]):
            assert token in keys or token in ds_keys, f"{name}: {token} is not a config key"


def test_the_check_names_a_variable_missing_from_the_table() -> None:
    rows = table(DOC.read_text())
    source = 'import os\nLEVEL = os.environ.get("REPRO_NEW_KNOB", "1")\n"""Docs may say REPRO_OTHER freely."""\n'
    read = {n.value: "probe.py" for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and NAME.fullmatch(n.value)}
    assert missing(read, rows) == ["REPRO_NEW_KNOB (read in probe.py)"]
