"""The package's layers (written once, in ``repro/__init__.py``) hold for every import in it.

A subpackage with a layer table of its own in its docstring (``repro/collectives/__init__.py``)
is layered the same way inside: its parts' imports point down its table too.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

import pytest

import repro

ROOT = pathlib.Path(repro.__file__).parent


def layers(package: str = "repro") -> dict[str, int]:
    """Name -> layer, parsed from the table in a package's docstring (empty when it has none)."""
    table: dict[str, int] = {}
    for line in (importlib.import_module(package).__doc__ or "").splitlines():
        m = re.match(r"^\s{4}(\d+)\s{2,}.+?\s{2,}([\w ]+)$", line)
        if m:
            for name in m.group(2).split():
                table[name] = int(m.group(1))
    return table


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: pathlib.Path, source: str | None = None) -> set[str]:
    """Every repro module named by an import anywhere in the file (``from a import b`` gives a.b if it is one)."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "repro")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "repro":
                continue
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)
    return {m for m in found if m in MODULES and m != mod}


def owner(mod: str, root: str = "repro") -> str | None:
    """The layered name under ``root`` a module belongs to (``repro.rl.metrics`` -> ``rl``).

    None for ``root`` itself and for modules outside it.
    """
    if not mod.startswith(root + "."):
        return None
    return mod[len(root) + 1 :].split(".")[0]


FILES = sorted(ROOT.rglob("*.py"))
MODULES = {module_name(p) for p in FILES}
# Every package whose docstring holds a layer table: repro itself, and the subpackages layered inside.
TABLES = {
    pkg: table
    for pkg in sorted(module_name(p) for p in FILES if p.name == "__init__.py")
    if (table := layers(pkg))
}


def test_the_layered_packages_are_repro_and_the_trace_tool() -> None:
    assert set(TABLES) == {"repro", "repro.collectives"}, "no layer table found in a package's docstring"


@pytest.mark.parametrize("package", sorted(TABLES))
def test_every_top_level_module_and_subpackage_has_a_layer(package: str) -> None:
    table = TABLES[package]
    names = {owner(m, package) for m in MODULES} - {None}
    where = package.replace(".", "/") + "/__init__.py"
    assert names - set(table) == set(), f"give these a layer in {where}"
    assert set(table) - names == set(), f"the layer table of {where} names what does not exist"


def test_at_most_ten_modules_directly_under_repro() -> None:
    top = [p.name for p in ROOT.glob("*.py")]
    assert len(top) <= 10, top


MODULE_LINES = 400
"""The house style's bound on a module (one concept a module): the package's, its tests' and its scripts'."""


def test_every_module_of_the_package_its_tests_and_its_scripts_is_under_400_lines() -> None:
    project = ROOT.parent
    long = {str(path.relative_to(project)): lines for folder in ("repro", "tests", "scripts")
            for path in sorted((project / folder).rglob("*.py"))
            if (lines := len(path.read_text().splitlines())) >= MODULE_LINES}
    assert not long, f"modules of {MODULE_LINES} lines or more (split them by concept): {long}"


def against_the_grain(mod: str, imported: set[str], root: str = "repro") -> list[str]:
    """Imports of ``mod`` that do not point down the layer table of ``root``."""
    table = TABLES[root]
    me = owner(mod, root)
    found = []
    for target in sorted(imported):
        them = owner(target, root)
        if me is None or them is None or them == me:
            continue
        if table[them] >= table[me]:
            found.append(f"{mod} (layer {table[me]}) imports {target} (layer {table[them]})")
    return found


def cycles(graph: dict[str, set[str]]) -> list[str]:
    found: list[str] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [mod])
    return found


@pytest.mark.parametrize("path", FILES, ids=lambda p: module_name(p))
def test_imports_point_down_the_layers(path: pathlib.Path) -> None:
    mod, imported = module_name(path), imports_of(path)
    problems = [p for root in TABLES for p in against_the_grain(mod, imported, root)]
    assert not problems, "\n".join(problems)


def test_no_import_cycle_inside_a_subpackage() -> None:
    graph = {}
    for p in FILES:
        mod = module_name(p)
        # A child importing its own package's __init__ re-exports, not a cycle through the body.
        graph[mod] = {t for t in imports_of(p) if owner(t) == owner(mod) and t != mod.rpartition(".")[0]}
    found = cycles(graph)
    assert not found, "\n".join(found)


def test_the_checks_catch_a_tie_against_the_grain_and_a_cycle() -> None:
    """The contract can fail: a lazy import of the workers inside config, and a two-module circle."""
    path = ROOT / "config" / "fields.py"
    source = path.read_text() + "\n\ndef _late():\n    from repro.workers.engine import DeepSpeedEngine  # noqa\n"
    assert against_the_grain("repro.config.fields", imports_of(path, source)) == [
        "repro.config.fields (layer 2) imports repro.workers.engine (layer 6)"
    ]
    assert against_the_grain("repro.workers.engine", {"repro.config.fields"}) == []
    assert cycles({"a.x": {"a.y"}, "a.y": {"a.x"}}) == ["a.x -> a.y -> a.x"]


def test_the_checks_catch_a_tie_against_the_grain_inside_the_trace_tool() -> None:
    """Inside repro.collectives: analyze reaching up into record, and launch into its layer-mate record."""
    path = ROOT / "collectives" / "analyze" / "align.py"
    source = path.read_text() + "\n\ndef _late():\n    from repro.collectives.record.tracer import active  # noqa\n"
    assert against_the_grain("repro.collectives.analyze.align", imports_of(path, source), "repro.collectives") == [
        "repro.collectives.analyze.align (layer 1) imports repro.collectives.record.tracer (layer 3)"
    ]
    assert against_the_grain(
        "repro.collectives.launch.launcher", {"repro.collectives.record.session"}, "repro.collectives"
    ) == ["repro.collectives.launch.launcher (layer 3) imports repro.collectives.record.session (layer 3)"]
    assert against_the_grain("repro.collectives.cli", {"repro.collectives.record.session"}, "repro.collectives") == []


def test_the_docs_layer_table_is_the_packages_own():
    """docs/architecture.md shows the table the package docstring defines; a drift fails here."""
    doc = (ROOT.parent / "docs" / "architecture.md").read_text()
    shown: dict[str, int] = {}
    for m in re.finditer(r"^\| (\d+) \| (.+?) \|$", doc, flags=re.M):
        for name in re.findall(r"`(\w+)`", m.group(2)):
            shown[name] = int(m.group(1))
    assert shown == layers()
