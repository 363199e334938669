"""Repository-wide pytest set-up: hypothesis profiles and the GPU gate's skip-or-fail rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=30, deadline=None)
# ci: the same examples on every machine and every run. derandomize seeds each test from its own
# source; database=None keeps a local example database (.hypothesis/) from replaying examples that
# another checkout never saw.
settings.register_profile(
    "ci",
    max_examples=60,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# The shared Ray head of each xdist worker (``ray_head``), for tests/distributed/ and tests/e2e/ alike.
pytest_plugins = ("tests.ray_head",)

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
settings.load_profile(PROFILE)


def _hypothesis_line(config: pytest.Config) -> str:
    current = settings()
    if current.derandomize:
        seed = "derandomized: each test's examples derive from its own source, the same on every machine"
    else:
        given = config.getoption("hypothesis_seed", None)
        seed = (f"--hypothesis-seed={given}" if given is not None else
                "random: a failure prints its @reproduce_failure blob; rerun with --hypothesis-seed=N to fix one")
    return (f"hypothesis profile {PROFILE!r} (HYPOTHESIS_PROFILE / CI): max_examples={current.max_examples}, "
            f"{seed}")


def pytest_report_header(config: pytest.Config) -> str:
    """Which examples this run draws (xdist workers load the same profile from the same environment)."""
    return _hypothesis_line(config)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    # Again at the end: the suites run with -q, which hides the header.
    terminalreporter.write_line(_hypothesis_line(config))

# The costliest modules first, most CPU first (per-test CPU on 2 cores, ``scripts/cpu_per_test.py``:
# results/test_suite_speed.md), then the other slow-marked tests, then the rest. The scheduler below
# hands tests out one at a time in this order: longest first keeps both workers busy until the end.
# One list for both multi-rank suites (tests/e2e/'s modules first, then tests/distributed/'s and the
# slow unit tests'); a run of one suite meets only its own names.
_LONG_MODULES = ("test_multinode.py", "test_lora_run.py", "test_run_safety.py", "test_bench_cli.py",
                 "test_bench_workers.py", "test_goldens.py", "test_verl_algorithms_e2e.py",
                 "test_checkpoint_fallback.py",
                 "test_sft.py", "test_batch_splits.py", "test_layout_parity.py", "test_policies.py",
                 "test_library_collectives.py", "test_programs.py", "test_trace.py", "test_trace_zero2.py", "test_checkpoint.py",
                 "test_launch.py", "test_functional.py")


def _cost_rank(item: pytest.Item) -> tuple[int, int]:
    name = item.path.name
    if name in _LONG_MODULES:
        return (0, _LONG_MODULES.index(name))
    return (1, 0) if item.get_closest_marker("slow") else (2, 0)


# Every test under these folders spawns real ranks (or a whole job's), whichever suite runs it.
_DISTRIBUTED_DIRS = tuple(Path(__file__).parent.resolve() / d for d in ("tests/distributed", "tests/e2e"))


def pytest_itemcollected(item: pytest.Item) -> None:
    # At collection, before `-m` selects: the marker must be there when the selection reads it.
    if any(item.path.resolve().is_relative_to(d) for d in _DISTRIBUTED_DIRS):
        item.add_marker(pytest.mark.distributed)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A stable sort: every xdist worker computes the same order, as xdist requires.
    items.sort(key=_cost_rank)


# Test modules whose tests share a module-scoped fixture too costly to build twice (a 2-node Ray
# cluster, a job that several tests read): under xdist they run as one unit on one worker.
_ONE_WORKER_MODULES = ("tests/e2e/cluster/test_multinode.py", "tests/e2e/test_trainer.py",
                       "tests/e2e/test_verl_algorithms_e2e.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``-n N`` (xdist's ``load``): hand out tests one at a time in collection order, so that the
    longest ones, sorted first (``tests/distributed/conftest.py``), start first on whichever worker
    is free. xdist's own ``load`` scheduler first gives each worker a chunk of a quarter of its
    share in collection order, which put every long test on one worker. The modules of
    ``_ONE_WORKER_MODULES`` go as one unit. (``--dist loadgroup`` would do the grouping, but
    pytest-xdist 3.8 marks groups through ``item._nodeid``, which pytest 9.2 no longer reads.)"""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LongestFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in _ONE_WORKER_MODULES else nodeid

        def _reschedule(self, node) -> None:
            # One unit queued behind the running test, not xdist's three: a long test that is
            # still queued waits for no worker but its own.
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) > 1:
                return
            self._assign_work_unit(node)

    config.option.loadscopereorder = False  # keep the collection order (longest first)
    return LongestFirst(config, log)


# Keep DeepSpeed on its CPU accelerator unless a GPU run asks otherwise.
if not os.environ.get("REPRO_GPU_TESTS"):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # Nothing on the CPU suites uses torch.compile, yet every ZeRO engine imports DeepSpeed's Muon
    # module (its optimizer type check), whose @torch.compile decorators import torch._inductor:
    # about 1.4 s per rank process. torch's own switch makes those decorators no-ops. Every rank,
    # Ray worker and job the suites start inherits it.
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")


def require_cuda_gpus(n: int) -> None:
    """Skip (or fail under ``REPRO_REQUIRE_GPU=1``) unless ``n`` CUDA GPUs are visible."""
    import torch

    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found >= n:
        return
    reason = f"needs {n} CUDA GPU{'s' if n != 1 else ''}, found {found}"
    if os.environ.get("REPRO_REQUIRE_GPU") == "1":
        pytest.fail(reason + " (REPRO_REQUIRE_GPU=1)")
    pytest.skip(reason)
