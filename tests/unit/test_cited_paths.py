"""Code and docs cite only files that exist.

Read: every line of README.md and of the ``*.md`` pages under docs/ and results/; the comments
and docstrings of the ``*.py`` files under repro/, tests/, scripts/ and results/ (and of
noxfile.py and conftest.py); the comment lines of the shell scripts under scripts/ and results/
and of .ci/run. A citation is

- a path under one of the repository's top-level folders (``TOP_DIRS``: ``repro/...``,
  ``tests/...``, ...), backticked, linked or plain, resolved from the repository root;
- a top-level file by name: ``TOP_FILES``, and any document named in capitals and ``.md`` (the
  convention for a repository's top-level pages, like README.md), resolved from the root;
- a path that starts with ``./`` or ``../``, and the target of a markdown link ``[text](target)``
  (not a URL, not an anchor), resolved from the citing file's folder as GitHub renders it.

Each must exist in the checkout, and a relative one must stay inside the repository (a path out
of it, such as a sibling checkout's file, is refused: a reader of the repository cannot open it).
The failure lists every missing citation as ``file:line: path``.

What is not a plain path, and what is checked of it instead (``check``):

- placeholders: a path is cut before its first component that holds ``<`` (``<run dir>``,
  ``run-<UTC time>``), ``$`` (``$RUN``) or is ``...``; the part before it must exist;
- globs (``*``, ``**``, ``?``; a ``[...]`` after a path is a pytest parameter id, not part of the
  path): must match at least one file or folder; braces
  (``bench_nccl.{log,json}``) are expanded and every alternative must exist;
- what a command writes: a path right after an output option (``--out``, ``--output``,
  ``--out-dir``, ``-o``) or a shell redirection (``>``, not the arrow ``->``) is not checked (it exists once the
  command ran);
- paths inside other paths are not the repository's: a match preceded by ``/``, ``$``, ``~``, a
  word character, ``.`` or ``-`` is skipped (``outputs/<run>/...``, ``$OUT/results/...``,
  ``/tmp/site/...``, ``.venv/...``): run outputs and machine folders, never committed;
- ``NOT_PATHS``: strings that look like repository paths and are not (each with its reason).
"""

from __future__ import annotations

import ast
import io
import itertools
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP_DIRS = ("repro", "tests", "scripts", "docs", "results", "fixtures", "constraints", ".ci", ".github")
TOP_FILES = ("noxfile.py", "conftest.py", "pyproject.toml")
_CAPITALS_MD = r"[A-Z][A-Z0-9_]*\.md"
NOT_PATHS = {
    # A reward function's data_source name (repro/data/arith.py, repro/rewards/), not a file.
    "repro/arith": "a data_source name",
    # verl's own repository (repro/integrations/verl/compare.py cites verl's engine test).
    "tests/special_e2e/": "a path in verl's repository",
}

_NOT_AFTER = r"(?<![\w./$~-])"
# A path's characters, plus the placeholders and brace lists that ``check`` understands.
_TAIL = r"(?:[\w.*?/-]|\{[\w.,*-]*\}|<[^<>\n]*>|\$\{?\w+\}?)*"
_TOP = "|".join(re.escape(d) for d in TOP_DIRS)
PATH = re.compile(
    _NOT_AFTER + rf"((?:\./|(?:\.\./)+)?(?:{_TOP})/{_TAIL}"  # under a top-level folder
    + rf"|(?:\.\./)+[\w.-]+(?:/{_TAIL})?"  # any ../ path (it must stay inside the repository)
    + "|(?:" + "|".join([*(re.escape(f) for f in TOP_FILES), _CAPITALS_MD]) + r")(?![\w.-]))"
)
LINK = re.compile(r"\]\(([^()\s]+)\)")
OUTPUT = re.compile(r"(?:--out(?:put)?(?:[-_]\w+)?[= ]\s*|(?<![-\w])-o\s+|(?<![-=])>{1,2}\s*)$")  # not after ->
_GLOB = re.compile(r"[*?]")


@dataclass(frozen=True)
class Citation:
    file: str
    line: int
    path: str
    problem: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.path} ({self.problem})"


def _expand_braces(path: str) -> list[str]:
    parts = re.split(r"(\{[^{}]*\})", path)
    options = [p[1:-1].split(",") if p.startswith("{") and p.endswith("}") else [p] for p in parts]
    return ["".join(combo) for combo in itertools.product(*options)]


def check(path: str, base: Path, root: Path = ROOT) -> str | None:
    """Why the cited ``path`` (relative to ``base``, a folder under ``root``) fails, or None."""
    path = path.rstrip(".,:;")
    if any(path == k or (k.endswith("/") and path.startswith(k)) for k in NOT_PATHS):
        return None
    parts = path.split("/")
    for i, part in enumerate(parts):
        if "<" in part or "$" in part or part == "...":
            path = "/".join(parts[:i])  # a placeholder: the folders before it must exist
            break
    if not path:
        return None
    for alternative in _expand_braces(path):
        target = (base / alternative).resolve()
        try:
            rel = target.relative_to(root.resolve())
        except ValueError:
            return "outside the repository"
        if _GLOB.search(alternative):
            if not any(root.glob(rel.as_posix())):
                return "no file matches"
        elif not target.exists():
            return "missing"
    return None


def _lines_of_page(text: str) -> list[tuple[int, str]]:
    return list(enumerate(text.splitlines(), 1))


def _lines_of_python(text: str) -> list[tuple[int, str]]:
    """The comments and docstrings of a Python file, with their line numbers; only those on lines where
    ``PATH`` matches (a citation in a comment or docstring matches on its whole line too, and with the same
    character before it), so that a file with no candidate is neither tokenized nor parsed."""
    lines = text.splitlines()
    candidates = {n for n, line in enumerate(lines, 1) if PATH.search(line)}
    if not candidates:
        return []
    out = []
    if any("#" in lines[n - 1] for n in candidates):
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT and tok.start[0] in candidates:
                out.append((tok.start[0], tok.string))
    # Docstrings open the bodies of modules, classes and functions, which sit only in statements: the
    # walk does not enter expressions (most of a tree's nodes).
    todo: list[ast.AST] = [ast.parse(text)]
    while todo:
        node = todo.pop()
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out += [(n, lines[n - 1]) for n in range(first.lineno, first.end_lineno + 1) if n in candidates]
        todo += [c for c in ast.iter_child_nodes(node) if isinstance(c, (ast.stmt, ast.excepthandler, ast.match_case))]
    return sorted(out)


def _lines_of_shell(text: str) -> list[tuple[int, str]]:
    return [(n, line) for n, line in enumerate(text.splitlines(), 1)
            if line.lstrip().startswith("#") and not line.startswith("#!")]


def citing_files(root: Path = ROOT) -> list[Path]:
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md")), *sorted((root / "results").rglob("*.md"))]
    code = [root / "noxfile.py", root / "conftest.py", root / ".ci" / "run"]
    for folder in ("repro", "tests", "scripts", "results"):
        code += sorted(p for p in (root / folder).rglob("*") if p.suffix in (".py", ".sh"))
    return [p for p in pages + code if p.is_file() and "__pycache__" not in p.parts]


def bad_citations(files: list[Path], root: Path = ROOT) -> list[Citation]:
    bad = []
    for file in files:
        text = file.read_text()
        if file.suffix == ".md":
            lines = _lines_of_page(text)
        elif file.suffix == ".py":
            lines = _lines_of_python(text)
        else:
            lines = _lines_of_shell(text)
        rel = file.relative_to(root).as_posix()
        for number, line in lines:
            found: list[tuple[str, Path]] = []
            for m in PATH.finditer(line):
                if OUTPUT.search(line[:m.start()]):
                    continue  # what a command writes (module docstring)
                cited = m.group(1)
                relative = cited.startswith(("./", "../"))
                found.append((cited, file.parent if relative else root))
            if file.suffix == ".md":
                for m in LINK.finditer(line):
                    target = m.group(1).split("#")[0]
                    if target and not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                        found.append((target, file.parent))
            for cited, base in dict.fromkeys(found):
                problem = check(cited, base, root)
                if problem:
                    bad.append(Citation(rel, number, cited, problem))
    return bad


def test_every_cited_repository_path_exists():
    files = citing_files()
    assert len(files) > 300 and ROOT / "README.md" in files
    bad = bad_citations(files)
    assert not bad, f"{len(bad)} cited path(s) do not exist:\n" + "\n".join(map(str, bad))


def test_the_rules_catch_a_missing_path_and_keep_to_their_exceptions(tmp_path):
    (tmp_path / "repro" / "run").mkdir(parents=True)
    code = tmp_path / "repro" / "run" / "paths.py"
    code.write_text('"""Writes `results/gpu_gate/` records."""\n\n# as docs/gone.md says\nNAME = "repro/gone.py"\n')
    (tmp_path / "results" / "gpu_gate").mkdir(parents=True)
    (tmp_path / "results" / "a.log").write_text("")
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "See `repro/run/paths.py` and `repro/run/gone.py:12` and [run](../repro/run/paths.py).\n"  # 1: gone.py
        "Records: `results/gpu_gate/run-<UTC time>/`, `results/*.log`, `results/a.{log,json}`.\n"  # 2: a.json
        "Run `python -m x --out results/new/table.tsv`; outputs in `outputs/x/repro/y.py`.\n"  # 3: fine
        "Writes -> results/gone.md, and x > results/new.md.\n"  # 4: the arrow is no redirection
        "Placeholder in a missing folder: `results/nope/<run dir>/`; glob `tests/*.py`.\n"  # 5: both
        "Out of the repository: `../../shared/DEVICE.md`; [link](missing.md); `repro/arith`.\n"  # 6: two
        "The rules are in DESIGN.md (not in the repository), the tests in `noxfile.py`.\n"  # 7: both
    )
    bad = {(c.file, c.line, c.path, c.problem) for c in bad_citations([page, code], tmp_path)}
    assert {b[1:] for b in bad if b[0] == "docs/page.md"} == {
        (1, "repro/run/gone.py", "missing"),
        (2, "results/a.{log,json}", "missing"),
        (4, "results/gone.md", "missing"),
        (5, "results/nope/<run dir>/", "missing"),
        (5, "tests/*.py", "no file matches"),
        (6, "../../shared/DEVICE.md", "outside the repository"),
        (6, "missing.md", "missing"),
        (7, "DESIGN.md", "missing"),
        (7, "noxfile.py", "missing"),
    }, bad
    # In code, comments and docstrings are read; a string in the code is not a citation.
    assert {b for b in bad if b[0] != "docs/page.md"} == {("repro/run/paths.py", 3, "docs/gone.md", "missing")}
