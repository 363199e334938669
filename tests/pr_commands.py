"""Reader of ``fixtures/pr_commands/*.txt``: verl's DeepSpeed PR command lines (verl -> repro).

Each file has ``# key: value`` header lines (``case``, ``source``, ``env``: the environment the
command sets, ``expect``: ``ok`` or ``error <text in the message>``) and then one override per
line. ``${NAME}`` in an override is a shell variable the caller supplies.
"""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass, field

FIXTURE_DIR = pathlib.Path(__file__).resolve().parent.parent / "fixtures" / "pr_commands"


@dataclass
class PrCommand:
    name: str
    env: dict[str, str]
    overrides: list[str]
    expect_error: str | None
    """None when the command must be accepted; else text its error message must contain."""
    header: dict[str, str] = field(default_factory=dict)

    def expanded(self, shell_vars: dict[str, str]) -> list[str]:
        """The overrides with ``${NAME}`` replaced as the shell would; an unset name is an error."""

        def sub(m: re.Match) -> str:
            if m.group(1) not in shell_vars:
                raise KeyError(f"{self.name}: shell variable {m.group(1)} is not given")
            return shell_vars[m.group(1)]

        return [re.sub(r"\$\{(\w+)\}", sub, line) for line in self.overrides]


def load_pr_command(path: pathlib.Path) -> PrCommand:
    header: dict[str, str] = {}
    overrides: list[str] = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            key, sep, value = line[1:].partition(":")
            if sep and re.fullmatch(r"\w+", key.strip()):
                header[key.strip()] = value.strip()
            continue
        overrides.append(line)
    env = dict(item.split("=", 1) for item in header.get("env", "").split())
    expect = header.get("expect", "ok")
    expect_error = None if expect == "ok" else expect.removeprefix("error").strip()
    return PrCommand(path.stem, env, overrides, expect_error, header)


def all_pr_commands() -> list[PrCommand]:
    return [load_pr_command(p) for p in sorted(FIXTURE_DIR.glob("*.txt"))]
