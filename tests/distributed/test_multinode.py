"""A real 2-node Ray cluster on this machine: placement, refusals, shared storage, a GRPO run and a lost node.

The cluster is ``ray.cluster_utils.Cluster``: a head and a worker node, each its own raylet
with one CPU, joined through the head's GCS; the ranks are CPU processes on gloo over the
loopback. Ray's convenience file ``/tmp/ray/ray_current_cluster`` is not written, so that no
other ``ray.init()`` on the machine joins this cluster by accident.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from repro.config import RunConfig


class NodeProbe:
    """A minimal hosted worker that joins the process group in its constructor, like the real ones."""

    def __init__(self) -> None:
        from repro.distributed import init_distributed

        init_distributed()

    def where(self) -> dict[str, str]:
        import ray

        keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        return {k: os.environ[k] for k in keys} | {"node": ray.get_runtime_context().get_node_id()}

    def all_reduce(self, value: float) -> float:
        t = torch.tensor([value])
        torch.distributed.all_reduce(t)
        return float(t.item())


@pytest.fixture
def cluster(monkeypatch):
    import ray
    from ray.cluster_utils import Cluster

    monkeypatch.setattr(ray._private.utils, "write_ray_address", lambda *a, **k: None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    c.worker = c.add_node(num_cpus=1)
    c.wait_for_nodes()
    try:
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()


def _cfg(address: str, nnodes: int = 2) -> RunConfig:
    cfg = RunConfig()
    cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node = nnodes, 1
    cfg.trainer.device, cfg.trainer.ray_address = "cpu", address
    return cfg


def _node_ids(cluster) -> set[str]:
    return {n.node_id for n in cluster.list_all_nodes()}


def test_two_nodes_get_one_rank_each_and_form_one_group(cluster, tmp_path):
    from repro.cluster import WorkerGroup, shutdown_ray

    group = WorkerGroup(_cfg(cluster.address), NodeProbe, shared_dirs=[("trainer.output_dir", tmp_path / "ckpt")])
    try:
        where = group.execute_all_same("where")
        print("ranks:", where)
        assert [w["RANK"] for w in where] == ["0", "1"] and [w["LOCAL_RANK"] for w in where] == ["0", "0"]
        assert {w["node"] for w in where} == _node_ids(cluster) and len({w["node"] for w in where}) == 2
        assert group.node_ids == [w["node"] for w in where]
        assert len({(w["MASTER_ADDR"], w["MASTER_PORT"]) for w in where}) == 1
        assert group.execute_all("all_reduce", [1.0, 10.0]) == [11.0, 11.0]
        assert list((tmp_path / "ckpt").iterdir()) == []  # the storage markers are cleaned up
    finally:
        group.shutdown()
        shutdown_ray()


def test_three_nodes_on_a_two_node_cluster_are_refused_before_any_rank_starts(cluster):
    import ray

    from repro.cluster import WorkerGroup, shutdown_ray
    from repro.placement import PlacementError

    with pytest.raises(PlacementError) as e:
        WorkerGroup(_cfg(cluster.address, nnodes=3), NodeProbe)
    print("refusal:", e.value)
    assert str(e.value).startswith("trainer.nnodes=3 x trainer.n_gpus_per_node=1 needs 3 such nodes but 2 of")
    assert ray.util.placement_group_table() == {} or all(
        pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())
    shutdown_ray()


# Runs in a private mount namespace: a tmpfs over the checkpoint folder is that node's local disk.
_LOCAL_DISK_NODE = textwrap.dedent("""
    import signal, subprocess, sys, time
    import ray, ray._private.node as node_mod, ray._private.parameter as param
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", sys.argv[2]], check=True)
    params = param.RayParams(gcs_address=sys.argv[1], num_cpus=1, num_gpus=0, min_worker_port=0,
                             max_worker_port=0, object_store_memory=150 * 2**20, include_log_monitor=False,
                             node_manager_port=0)
    node = node_mod.Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)
    ray._private.services.wait_for_node(sys.argv[1], node.plasma_store_socket_name, 60)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    print("NODE_ID", node.node_id, flush=True)
    while True:
        time.sleep(1)
""")


def _can_unshare_mounts() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(not _can_unshare_mounts(), reason="needs `unshare -m` (root) to give a node its own disk")
def test_checkpoint_folder_on_one_nodes_local_disk_is_refused(tmp_path, monkeypatch):
    import ray
    from ray.cluster_utils import Cluster

    from repro.cluster import WorkerGroup, shutdown_ray
    from repro.shared_storage import StorageError

    monkeypatch.setattr(ray._private.utils, "write_ray_address", lambda *a, **k: None)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    head = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    local = subprocess.Popen(["unshare", "-m", "--propagation", "private", sys.executable, "-c", _LOCAL_DISK_NODE,
                              head.address, str(ckpt)], stdout=subprocess.PIPE, text=True)
    try:
        node_id = next(line.split()[1] for line in local.stdout if line.startswith("NODE_ID "))
        with pytest.raises(StorageError) as e:
            WorkerGroup(_cfg(head.address), NodeProbe, shared_dirs=[("trainer.default_local_dir", ckpt)])
        print("refusal:", e.value)
        msg = str(e.value)
        assert msg.startswith(f"trainer.default_local_dir={ckpt} is not shared by every node: node {node_id[:12]} ")
        assert "cannot read the driver's marker" in msg and "\n" not in msg
        assert list(ckpt.iterdir()) == []
    finally:
        shutdown_ray()
        local.terminate()
        local.wait(timeout=60)
        head.shutdown()

