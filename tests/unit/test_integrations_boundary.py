"""repro's core never imports verl, TRL or an integration (``repro/integrations/__init__.py``).

verl pins transformers<5.11 and lives in .venv-verl only; a core module that imported it (or the
verl integration, which imports it) would break repro's own install. Read from the source, so it
also holds for modules no test imports.
"""

from __future__ import annotations

import ast
import pathlib

REPRO = pathlib.Path(__file__).resolve().parents[2] / "repro"
FORBIDDEN = ("verl", "trl", "repro.integrations")


def _imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_core_module_imports_verl_or_an_integration() -> None:
    offenders = []
    for path in sorted(REPRO.rglob("*.py")):
        if path.is_relative_to(REPRO / "integrations"):
            continue
        bad = [n for n in _imports(path) if any(n == f or n.startswith(f + ".") for f in FORBIDDEN)]
        if bad:
            offenders.append(f"{path.relative_to(REPRO.parent)}: {sorted(bad)}")
    assert not offenders, offenders
    # The check sees imports at all: the integration itself is caught by it.
    assert "verl.workers.engine.base" in _imports(REPRO / "integrations" / "verl" / "engine.py")
