"""No hypothesis test in the suite runs fewer than 10 examples (a property tried once proves little)."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MIN_EXAMPLES = 10


def _module_ints(tree: ast.Module) -> dict[str, int]:
    """Module-level ``NAME = <int>`` assignments (how tests name their example counts)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, int):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node.value.value
    return out


def max_examples_below(source: str, minimum: int = MIN_EXAMPLES) -> list[str]:
    """``line: value`` of every ``max_examples=`` that is below ``minimum`` or cannot be read as a number."""
    tree = ast.parse(source)
    names = _module_ints(tree)
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for kw in node.keywords:
            if kw.arg != "max_examples":
                continue
            value = kw.value
            if isinstance(value, ast.Constant) and isinstance(value.value, int):
                number = value.value
            elif isinstance(value, ast.Name) and value.id in names:
                number = names[value.id]
            else:
                # A function parameter is checked where the caller passes a number.
                if isinstance(value, ast.Name) and _is_parameter(tree, node, value.id):
                    continue
                bad.append(f"{node.lineno}: {ast.unparse(value)} (not a number the check can read)")
                continue
            if number < minimum:
                bad.append(f"{node.lineno}: {number}")
    return bad


def _is_parameter(tree: ast.Module, call: ast.Call, name: str) -> bool:
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(n is call for n in ast.walk(fn)):
            if name in {a.arg for a in fn.args.args + fn.args.kwonlyargs}:
                return True
    return False


def _suite_files() -> list[pathlib.Path]:
    return sorted([*ROOT.glob("tests/**/*.py"), ROOT / "conftest.py"])


def test_no_hypothesis_test_runs_fewer_than_ten_examples():
    offenders = {}
    for path in _suite_files():
        bad = max_examples_below(path.read_text())
        if bad:
            offenders[str(path.relative_to(ROOT))] = bad
    assert not offenders, f"max_examples below {MIN_EXAMPLES}: {offenders}"


_ONE, _NINE = 1, 9


@pytest.mark.parametrize(
    ("source", "found"),
    [
        # The counts are spliced in so that this file holds no low max_examples of its own.
        (f"@settings(max_examples={_ONE})\ndef t(): pass\n", ["1: 1"]),
        ("N = 3\n@settings(max_examples=N, deadline=None)\ndef t(): pass\n", ["2: 3"]),
        (f"settings.register_profile('x', max_examples={_NINE})\n", ["1: 9"]),
        ("N = 25\n@settings(max_examples=N)\ndef t(): pass\n", []),
        ("@settings(max_examples=int('5'))\ndef t(): pass\n", ["1: int('5') (not a number the check can read)"]),
        ("def f(n):\n    return settings(max_examples=n)\n", []),
    ],
)
def test_the_scan_finds_low_and_unreadable_counts(source, found):
    assert max_examples_below(source) == found


def test_ci_profile_is_derandomized_and_every_nox_session_passes_it(monkeypatch):
    """CI=1 selects the derandomized profile in every session that runs pytest, nox -s verl's included
    (its own interpreter reads the same root conftest.py)."""
    import importlib.util

    from hypothesis import settings

    ci = settings.get_profile("ci")
    assert ci.derandomize and ci.database is None
    spec = importlib.util.spec_from_file_location("noxfile_under_test", ROOT / "noxfile.py")
    if importlib.util.find_spec("nox") is None:
        pytest.skip("nox is not installed here")
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    monkeypatch.setenv("CI", "1")
    assert noxfile._profile() == {"HYPOTHESIS_PROFILE": "ci"}
    source = (ROOT / "noxfile.py").read_text()
    # every session that starts pytest hands it the profile
    starts = source.count("*PYTEST,") + source.count('".venv-verl/bin/python", "-m", "pytest"')
    assert starts >= 6 and source.count("**_profile()") >= starts
