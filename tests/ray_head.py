"""The shared local Ray head of one pytest(-xdist) worker: the ``ray_head`` fixture that the distributed
suite's Ray tests (``tests/distributed/cluster/``) and the end-to-end jobs (``tests/e2e/``) join.

The root ``conftest.py`` loads this module as a plugin (``pytest_plugins``), so both suites see one
fixture and each pytest run starts at most one head per worker.
Importing this module also turns off Ray's pre-started idle workers for every node and job the tests
start (below).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# Every Ray node a test starts (the shared heads, the multinode cluster, the jobs that start their
# own) would pre-start one idle Python worker per CPU; a job's ranks are actors with a runtime
# environment of their own and never use them, so each was ~1 CPU s of start-up and ~0.4% of a
# core while the node lived. Inherited by every job the tests start.
os.environ.setdefault("RAY_enable_worker_prestart", "0")


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
