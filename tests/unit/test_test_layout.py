"""The test tree's own layout: no test module imports another test module.

What tests share lives in helper modules (``tests/jobs.py`` for real jobs, ``tests/multirank.py``
for ranks, ``tests/error_model.py``, a package's ``helpers.py`` ...). A test module that exports
helpers to others ties them to its own fixtures, markers and import cost, and hides the harness
where a newcomer does not look for it: pytest collects ``test_*`` modules, it does not share them.
"""

from __future__ import annotations

import ast
import pathlib

TESTS = pathlib.Path(__file__).resolve().parents[1]


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(TESTS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _test_module_in(name: str) -> str | None:
    """The ``test_*`` module that ``name`` is or lies in (``tests.a.test_b.c`` -> ``tests.a.test_b``), if
    it is one of ours: under ``tests`` or a bare top-level name (the rootdir on sys.path). Third-party
    modules are not looked at."""
    parts = name.split(".")
    if parts[0] != "tests" and len(parts) > 1:
        return None
    for i, part in enumerate(parts):
        if part.startswith("test_"):
            return ".".join(parts[: i + 1])
    return None


def imports_of_test_modules(source: str, module: str) -> list[tuple[int, str]]:
    """(line, test module) of every import in ``source`` (module ``module``) that names a ``test_*``
    module: ``import tests.x.test_y``, ``from tests.x.test_y import z``, ``from tests.x import test_y``,
    the relative forms, a bare ``import test_y``, and ``importlib.import_module("tests.x.test_y")``."""
    package = module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target, *(f"{target}.{a.name}" for a in node.names)]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
              in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        hits = [m for m in map(_test_module_in, names) if m]
        if hits:
            found.append((node.lineno, hits[0]))
    return found


def test_the_import_finder_sees_each_form_of_importing_a_test_module():
    source = "\n".join([
        "from tests.distributed.test_trainer import _run",
        "from tests.distributed import test_trainer",
        "import tests.unit.config.test_ds_config",
        "from .test_worker_group import RankProbe",
        "from . import test_trace",
        "import test_trainer",
        "import importlib; importlib.import_module('tests.gpu_e2e.test_grpo_gate')",
        # Helpers and ordinary modules are fine, and so is a test module's own name in text.
        "from tests import jobs",
        "from tests.jobs import ROOT, check_outputs",
        "from tests.multirank import run_ranks",
        "from conftest import require_cuda_gpus",
        "import pytest",
        "NOTE = 'from tests.distributed.test_trainer import _run'",
    ])
    found = imports_of_test_modules(source, "tests.distributed.cluster.test_multinode")
    assert [line for line, _ in found] == [1, 2, 3, 4, 5, 6, 7], found
    assert ("tests.distributed.cluster.test_worker_group" in {n for _, n in found}
            and "tests.distributed.cluster.test_trace" in {n for _, n in found})


def test_no_test_module_imports_another_test_module():
    files = sorted(TESTS.rglob("*.py"))
    assert pathlib.Path(__file__).resolve() in files and len(files) > 100  # the walk sees the tree
    offences = [f"{path.relative_to(TESTS.parent)}:{line} imports {name}"
                for path in files
                for line, name in imports_of_test_modules(path.read_text(), _module_name(path))]
    assert not offences, ("test modules are not libraries: move what they share into a helper module "
                          "(tests/jobs.py for jobs)\n" + "\n".join(offences))
