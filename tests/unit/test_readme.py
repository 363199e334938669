"""README truth: every command block marked ``<!-- runnable ... -->`` in README.md and docs/*.md
runs and does what it says, and every file the README names exists.

A marker sits on the line before a ``bash`` fence: ``<!-- runnable -->`` runs the block as it is,
``append="X"`` adds ``X`` to each ``python -m repro.main_ppo`` command (the README says so next to
the block), ``expect="T"`` requires ``T`` in stdout. Each block runs in bash from the repository
root with ``python`` being this interpreter and ``HOME`` a temporary folder; it must exit 0, and a
dry run's last stdout line must be its JSON plan.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.subprocess_env import pythonpath

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"<!--\s*runnable\b(?P<attrs>[^>]*)-->\s*\n```(?:bash|sh)\n(?P<body>.*?)\n```", re.S)
ATTR = re.compile(r'(\w+)="([^"]*)"')


@dataclass
class Block:
    page: str
    line: int
    body: str
    append: str
    expect: str

    def script(self) -> str:
        joined = re.sub(r"\\\n\s*", "", self.body)  # the shell's line continuations
        if not self.append:
            return joined
        return "\n".join(f"{ln} {self.append}" if "-m repro.main_ppo" in ln else ln for ln in joined.splitlines())


def runnable_blocks(text: str, page: str = "README.md") -> list[Block]:
    blocks = []
    for m in MARKER.finditer(text):
        attrs = dict(ATTR.findall(m.group("attrs")))
        unknown = set(attrs) - {"append", "expect"}
        assert not unknown, f"{page} line {text[:m.start()].count(chr(10)) + 1}: unknown marker attribute {unknown}"
        blocks.append(Block(page, text[: m.start()].count("\n") + 1, m.group("body"), attrs.get("append", ""),
                            attrs.get("expect", "")))
    return blocks


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [b for page in PAGES for b in runnable_blocks(page.read_text(), page.relative_to(ROOT).as_posix())]


def test_the_readme_marks_its_dry_run_example_and_the_gsm8k_commands_runnable():
    assert len(BLOCKS) >= 3
    assert any(b.page == "README.md" and "trainer.dry_run=true" in b.body for b in BLOCKS)
    assert any("zero_stage=3" in b.body and "trainer.dry_run=true" in b.body for b in BLOCKS)
    assert any("repro.data gsm8k" in b.body for b in BLOCKS)


def test_a_block_that_fails_is_caught(tmp_path):
    bad = runnable_blocks('<!-- runnable expect="x" -->\n```bash\npython -m repro.main_ppo -cn nope trainer.dry_run=true\n```')
    assert _run(bad[0], tmp_path).returncode == 2


def _run(block: Block, home: Path) -> subprocess.CompletedProcess:
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": pythonpath(ROOT), "DS_ACCELERATOR": "cpu",
           "PATH": os.pathsep.join([str(home / "bin"), bindir, os.environ.get("PATH", "")])}
    (home / "bin").mkdir(parents=True, exist_ok=True)
    python = home / "bin" / "python"
    if not python.exists():
        python.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
        python.chmod(0o755)
    return subprocess.run(["bash", "-e", "-c", block.script()], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b.page} line {b.line}" for b in BLOCKS])
def test_runnable_readme_block_does_what_the_readme_says(block, tmp_path):
    proc = _run(block, tmp_path)
    assert proc.returncode == 0, f"{block.page} line {block.line} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert block.expect in proc.stdout, proc.stdout[-3000:]
    if "trainer.dry_run=true" in block.script():
        json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_file_and_page_the_readme_names_exists():
    text = (ROOT / "README.md").read_text()
    named = set(re.findall(r"`((?:results|tests|scripts|docs|repro)/[^`*<> ]+)`", text))
    named |= set(re.findall(r"\]\(((?:docs|results)/[^)#]+)", text))
    assert len(named) > 20
    missing = sorted(n for n in named if not (ROOT / n).exists())
    assert not missing, missing
