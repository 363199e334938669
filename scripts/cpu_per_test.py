"""Per-test CPU seconds under pytest-xdist, Ray daemons and rank processes included (a pytest plugin).

Each xdist worker moves itself into a cgroup-v1 ``cpuacct`` group of its own at start-up, so
every process it starts (rank pools, forkservers, its Ray head and the raylet's workers, job
subprocesses) is counted; a test's CPU is the group's usage across its setup, call and teardown
(a session fixture's start-up counts to the first test that uses it). Unlike wall times, these
figures barely move when other work shares the machine. Needs a writable
``/sys/fs/cgroup/cpuacct`` (root in a container, as here and on the CI machine), like
``scripts/cpu_time.py``.

    PYTHONPATH=$PWD:$PWD/scripts CPU_PER_TEST_OUT=/tmp/cpu.tsv python -m pytest ... -n 2 -p cpu_per_test

Rows (appended): worker, start time, wall s, CPU s, node id; one ``TOTAL`` row per worker at the end.
"""

from __future__ import annotations

import os
import pathlib
import time

import pytest

_CPUACCT = pathlib.Path("/sys/fs/cgroup/cpuacct")
_OUT = pathlib.Path(os.environ.get("CPU_PER_TEST_OUT", "cpu_per_test.tsv"))
_group: pathlib.Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _group
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    _group = _CPUACCT / f"cpu_per_test_{worker}_{os.getpid()}"
    _group.mkdir(exist_ok=True)
    (_group / "cgroup.procs").write_text(str(os.getpid()))


def _usage_s() -> float:
    assert _group is not None
    return int((_group / "cpuacct.usage").read_text()) / 1e9


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    if _group is None:
        yield
        return
    cpu0, t0 = _usage_s(), time.time()
    yield
    cpu1, t1 = _usage_s(), time.time()
    with open(_OUT, "a") as f:
        f.write(f"{os.environ['PYTEST_XDIST_WORKER']}\t{t0:.1f}\t{t1 - t0:.1f}\t{cpu1 - cpu0:.1f}\t{item.nodeid}\n")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _group is not None:
        with open(_OUT, "a") as f:
            f.write(f"{os.environ['PYTEST_XDIST_WORKER']}\tEND\t{time.time():.1f}\t{_usage_s():.1f}\tTOTAL\n")
