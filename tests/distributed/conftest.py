"""Fixtures for multi-rank tests: the `multirank` runner, the warm `rank_pool`, the shared `ray_head`
and the `distributed` marker."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.jobs import GRPO_3_STEPS, PPO_3_STEPS_KEEP, SharedRun
from tests.multirank import run_ranks
from tests.rank_pool import RankPool

_HERE = pathlib.Path(__file__).parent.resolve()

# Every Ray node a test starts (the shared heads, the multinode cluster, the jobs that start their
# own) would pre-start one idle Python worker per CPU; a job's ranks are actors with a runtime
# environment of their own and never use them, so each was ~1 CPU s of start-up and ~0.4% of a
# core while the node lived. Inherited by every job the tests start.
os.environ.setdefault("RAY_enable_worker_prestart", "0")


# The costliest modules first, most CPU first (measured 2026-11-25 with a per-test cgroup on 2
# cores: results/test_suite_speed.md), then the other slow-marked tests, then the rest. The
# root conftest's scheduler hands tests out one at a time in this order (longest first keeps both
# workers busy until the end).
_LONG_MODULES = ("test_multinode.py", "test_lora_run.py", "test_run_safety.py", "test_sft.py", "test_bench_cli.py",
                 "test_bench_workers.py", "test_batch_splits.py", "test_checkpoint_fallback.py",
                 "test_verl_algorithms_e2e.py", "test_goldens.py", "test_trace.py", "test_launch.py")


def _cost_rank(item: pytest.Item) -> tuple[int, int]:
    name = item.path.name
    if name in _LONG_MODULES:
        return (0, _LONG_MODULES.index(name))
    return (1, 0) if item.get_closest_marker("slow") else (2, 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # This hook sees the whole session's items, not only this directory's.
    for item in items:
        if item.path.resolve().is_relative_to(_HERE):
            item.add_marker(pytest.mark.distributed)
    # A stable sort: every xdist worker computes the same order, as xdist requires.
    items.sort(key=_cost_rank)


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


@pytest.fixture(scope="session")
def ray_head() -> Iterator[str]:
    """The address of one local Ray head per pytest(-xdist) worker, for end-to-end jobs to join
    (``RAY_ADDRESS``) instead of each starting and stopping a cluster of its own (about 5 s and a
    dozen daemon and pre-started worker processes per job on 2 cores). Jobs that test what
    happens to a job's own Ray processes (kill -9, Ctrl-C, a lost rank) keep starting their own.
    Jobs that join it also set ``REPRO_REUSE_RANKS=1``: their rank processes outlive them and host
    the next job's ranks (``repro.cluster.worker_group``), which saves each job the ranks' start-up."""
    import ray
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as mp:
        # Not in /tmp/ray/ray_current_cluster: no other ray.init() on the machine may join it by accident.
        mp.setattr(ray._private.utils, "write_ray_address", lambda *a, **k: None)
        mp.delenv("RAY_ADDRESS", raising=False)
        head = Cluster(initialize_head=True, head_node_args={"num_cpus": os.cpu_count() or 1,
                                                            "object_store_memory": 256 * 1024**2})
        try:
            yield head.address
        finally:
            head.shutdown()


@pytest.fixture(scope="session")
def grpo_3_step_reference(tmp_path_factory: pytest.TempPathFactory, ray_head: str) -> Iterator[SharedRun]:
    """The uninterrupted 3-step GRPO job (``jobs.GRPO_3_STEPS``) that the 2-node test and the kill -9
    resume test both compare with: run once per session, by whichever of them starts first, and
    read by both from the folder all xdist workers share (the session's temp root; a worker's own
    basetemp without xdist). Saves one warm job per suite (~10 CPU s). A worker that starts it runs
    it on its own ``ray_head`` (torn down after this fixture, so the job never outlives it)."""
    yield from _shared_run(tmp_path_factory, "grpo_3_step_reference", "grpo_tiny", GRPO_3_STEPS, ray_head)


@pytest.fixture(scope="session")
def ppo_3_step_run(tmp_path_factory: pytest.TempPathFactory, ray_head: str) -> Iterator[SharedRun]:
    """The 3-step PPO job (``jobs.PPO_3_STEPS_KEEP``: a checkpoint every step, keep limits 1 actor
    and 2 critic) that test_trainer checks as a run and test_checkpoint_fallback for what each role
    keeps: run once per session, as ``grpo_3_step_reference``. Saves one PPO job (~15 CPU s)."""
    yield from _shared_run(tmp_path_factory, "ppo_3_step_run", "ppo_tiny", PPO_3_STEPS_KEEP, ray_head)


def _shared_run(tmp_path_factory: pytest.TempPathFactory, name: str, preset: str, overrides: list[str],
                ray_head: str) -> Iterator[SharedRun]:
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    run = SharedRun(root / name, preset, overrides, ray_head)
    try:
        yield run
    finally:
        run.close()
