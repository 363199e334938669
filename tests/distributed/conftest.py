"""Fixtures for multi-rank tests: the `multirank` runner, the warm `rank_pool`, the shared `ray_head`
(``tests/ray_head.py``, a plugin of the root conftest); the root conftest marks these tests `distributed`.
Whole jobs are ``tests/e2e/``'s."""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import pytest

from tests.multirank import run_ranks
from tests.rank_pool import RankPool


@pytest.fixture
def multirank(tmp_path: pathlib.Path) -> Callable[..., list]:
    """`run_ranks` bound to this test's tmp_path (rank logs, results and the FileStore live there)."""

    def run(
        fn: Callable[..., Any],
        world_size: int = 2,
        timeout_s: float = 60,
        args: tuple = (),
        env: dict[str, str] | None = None,
        deepspeed: bool = True,
    ) -> list:
        return run_ranks(
            fn,
            world_size,
            tmp_path=tmp_path,
            timeout_s=timeout_s,
            args=args,
            env=env,
            deepspeed=deepspeed,
        )

    return run


@pytest.fixture(scope="session")
def rank_pool():
    """Two warm gloo ranks per pytest(-xdist) worker, shared by the tests of that worker."""
    with RankPool(size=2) as pool:
        yield pool


@pytest.fixture
def pooled(rank_pool: RankPool, tmp_path: pathlib.Path) -> Callable[..., list]:
    """`multirank` on the warm pool: same call, same failure reports, no per-call rank start-up."""

    def run(fn: Callable[..., Any], world_size: int = 2, timeout_s: float = 60, args: tuple = (),
            env: dict[str, str] | None = None, deepspeed: bool = True) -> list:
        return rank_pool.run(fn, world_size, tmp_path=tmp_path, timeout_s=timeout_s, args=args, env=env,
                             deepspeed=deepspeed)

    return run
