"""The DeepSpeed-engine conformance tests need verl and DeepSpeed (``nox -s verl``: .venv-verl)."""

from __future__ import annotations

import importlib.util
import pathlib
from collections.abc import Callable
from typing import Any

import pytest

collect_ignore_glob: list[str] = []
if importlib.util.find_spec("verl") is None or importlib.util.find_spec("deepspeed") is None:
    collect_ignore_glob.append("test_*.py")


@pytest.fixture
def multirank(tmp_path: pathlib.Path) -> Callable[..., list]:
    """``tests.multirank.run_ranks`` (the one multi-rank harness) bound to this test's tmp_path."""
    from tests.multirank import run_ranks

    def run(fn: Callable[..., Any], world_size: int = 2, timeout_s: float = 240, args: tuple = ()) -> list:
        return run_ranks(fn, world_size, tmp_path=tmp_path, timeout_s=timeout_s, args=args)

    return run
