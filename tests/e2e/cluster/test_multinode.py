"""A real 2-node Ray cluster on this machine: placement, refusals, shared storage, a GRPO run and a lost node.

The cluster is ``ray.cluster_utils.Cluster``: a head and a worker node, each its own raylet
with one CPU, joined through the head's GCS; the ranks are CPU processes on gloo over the
loopback. Ray's convenience file ``/tmp/ray/ray_current_cluster`` is not written, so that no
other ``ray.init()`` on the machine joins this cluster by accident.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from repro.config import RunConfig
from tests import jobs
from tests.distributed.cluster.probes import RankProbe
from tests.jobs import SMALL, job_env


class NodeProbe(RankProbe):
    """The cluster tests' probe worker, also telling which Ray node it runs on."""

    def where(self) -> dict[str, str]:
        import ray

        keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        return {k: os.environ[k] for k in keys} | {"node": ray.get_runtime_context().get_node_id()}

    def fail_on(self, rank: int) -> None:
        """Rank ``rank`` raises; the others wait in a collective for it, as real peers would."""
        if int(os.environ["RANK"]) == rank:
            raise ValueError(f"bad shard on rank {rank}")
        torch.distributed.barrier()


@pytest.fixture(scope="module")
def cluster():
    """Head + worker node, one CPU each; shared by the module's tests (the last one replaces the worker)."""
    import ray
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ray._private.utils, "write_ray_address", lambda *a, **k: None)
        mp.delenv("RAY_ADDRESS", raising=False)
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


@pytest.fixture(scope="module")
def probe_group(cluster, tmp_path_factory):
    """One 2-rank probe group on the two nodes for the next two tests (until 2026-11-27 each started
    its own, ~5 s of fresh ranks): the placement test reads it, then the rank-error test makes
    rank 1 fail and shuts it down, freeing both nodes' CPUs for the module's later tests (pytest
    runs a module's tests in file order, and the module as one unit on one xdist worker). Yields
    the group and its checkpoint folder."""
    from repro.cluster.worker_group import WorkerGroup, shutdown_ray

    ckpt = tmp_path_factory.mktemp("probe") / "ckpt"
    group = WorkerGroup(_cfg(cluster.address), NodeProbe, "probe", shared_dirs=[("trainer.output_dir", ckpt)])
    try:
        yield group, ckpt
    finally:
        if group.actors:  # the rank-error test did not run (deselected) or did not get to its shutdown
            group.shutdown()
        shutdown_ray()


def test_two_nodes_get_one_rank_each_and_form_one_group(cluster, probe_group):
    group, ckpt = probe_group
    where = group.execute_all_same("where")
    print("ranks:", where)
    assert [w["RANK"] for w in where] == ["0", "1"] and [w["LOCAL_RANK"] for w in where] == ["0", "0"]
    assert {w["node"] for w in where} == _node_ids(cluster) and len({w["node"] for w in where}) == 2
    assert group.node_ids == [w["node"] for w in where]
    assert len({(w["MASTER_ADDR"], w["MASTER_PORT"]) for w in where}) == 1
    assert group.execute_all("all_reduce", [1.0, 10.0]) == [11.0, 11.0]
    assert list(ckpt.iterdir()) == []  # the storage markers are cleaned up


def test_a_rank_error_is_not_taken_for_a_lost_node(probe_group):
    from repro.cluster.errors import WorkerError
    from repro.cluster.worker_group import shutdown_ray

    group, _ = probe_group
    started = time.monotonic()
    try:
        # Both nodes are alive: the rank's own error comes back as its WorkerError, not as a
        # NodeLostError, and without the node-death poll: the peer sits in a barrier, busy, not
        # gone. (With the earlier probe, which took a busy rank for a gone one, this took 73 s.)
        with pytest.raises(WorkerError, match="rank 1 on host .* failed in fail_on: ValueError: bad shard on rank 1"):
            group.execute_all_same("fail_on", 1)
        elapsed = time.monotonic() - started
    finally:
        group.shutdown()
        shutdown_ray()
    print(f"rank error surfaced in {elapsed:.1f} s")
    assert elapsed < 30


def test_three_nodes_on_a_two_node_cluster_are_refused_before_any_rank_starts(cluster):
    import ray

    from repro.cluster.placement import PlacementError
    from repro.cluster.worker_group import WorkerGroup, shutdown_ray

    with pytest.raises(PlacementError) as e:
        WorkerGroup(_cfg(cluster.address, nnodes=3), NodeProbe, "probe")
    print("refusal:", e.value)
    assert str(e.value).startswith("trainer.nnodes=3 x trainer.n_gpus_per_node=1 needs 3 such nodes but 2 of")
    assert ray.util.placement_group_table() == {} or all(
        pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())
    shutdown_ray()


def test_two_nodes_without_a_cluster_to_join_exit_2_with_one_line(tmp_path):
    env = job_env(tmp_path / "outputs")
    env.pop("RAY_ADDRESS", None)
    proc = jobs.run(jobs.cli_command("grpo_tiny", *SMALL, "trainer.nnodes=2", "trainer.n_gpus_per_node=1",
                                     "trainer.total_training_steps=1"), env, timeout=180, check=False)
    last = proc.stderr.strip().splitlines()[-1]
    print("refusal:", last)
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert last.startswith("error: trainer.nnodes=2 needs a Ray cluster of 2 nodes: set trainer.ray_address")
    assert "Traceback" not in proc.stderr and "worker group" not in proc.stderr


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

    from repro.cluster.shared_storage import StorageError
    from repro.cluster.worker_group import WorkerGroup, shutdown_ray

    monkeypatch.setattr(ray._private.utils, "write_ray_address", lambda *a, **k: None)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    head = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    local = subprocess.Popen(["unshare", "-m", "--propagation", "private", sys.executable, "-c", _LOCAL_DISK_NODE,
                              head.address, str(ckpt)], stdout=subprocess.PIPE, text=True)
    try:
        node_id = next(line.split()[1] for line in local.stdout if line.startswith("NODE_ID "))
        with pytest.raises(StorageError) as e:
            WorkerGroup(_cfg(head.address), NodeProbe, "probe", shared_dirs=[("trainer.default_local_dir", ckpt)])
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



def _grpo(out: Path, *extra: str) -> list[str]:
    # The shared reference's config (jobs.GRPO_3_STEPS: no validation, which no compared row
    # holds) on the 2-node cluster (``extra``).
    return jobs.cli_command("grpo_tiny", *jobs.GRPO_3_STEPS, f"trainer.output_dir={out}", *extra)


@pytest.mark.slow  # three GRPO jobs (two at once) and a refused one: about 2-3 min on 2 busy cores
def test_grpo_on_two_nodes_equals_one_node_and_survives_a_lost_node(cluster, tmp_path, grpo_3_step_reference):
    two_nodes = tmp_path / "two_nodes"
    on_cluster = ["trainer.nnodes=2", "trainer.n_gpus_per_node=1", f"trainer.ray_address={cluster.address}"]
    # The single-node reference (the preset's 2 ranks on one node, on a worker's shared Ray head)
    # runs alongside the 2-node run, or has already run for the kill -9 resume test: the same
    # command, so the same rows (conftest's grpo_3_step_reference).
    grpo_3_step_reference.start()
    # The victim pauses 8 s after its step-2 checkpoint: the node is gone before its last step.
    victim = jobs.start(_grpo(two_nodes, *on_cluster),
                        dict(job_env(tmp_path / "outputs"), REPRO_HOLD_AFTER_CHECKPOINT="2:8"))
    try:
        jobs.wait_for_checkpoint(victim, two_nodes, 2, 300)
        lost = cluster.worker.node_id
        cluster.remove_node(cluster.worker, allow_graceful=False)  # its raylet and its rank die
        victim_out, _ = victim.communicate(timeout=180)
    finally:
        if victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)
    print("lost node:", lost, "| driver's last lines:", victim_out.strip().splitlines()[-3:])
    assert victim.returncode == 1, victim_out[-6000:]
    assert victim_out.strip().splitlines()[-1].startswith("error: lost rank ")
    assert f"on node {lost[:12]} " in victim_out.strip().splitlines()[-1]

    # Resuming while the node is gone is refused before any rank starts, naming the lost node.
    refused = jobs.run(_grpo(two_nodes, *on_cluster), job_env(tmp_path / "outputs"), timeout=180, check=False)
    print("resume refused:", refused.stderr.strip().splitlines()[-1])
    assert refused.returncode == 2, refused.stderr[-4000:]
    assert refused.stderr.strip().splitlines()[-1].startswith(
        "error: trainer.nnodes=2 x trainer.n_gpus_per_node=1 needs 2 such nodes but 1 of the Ray cluster at ")
    assert f"lost (dead): {lost[:12]}" in refused.stderr

    # A replacement node joins; the run resumes from its step-2 checkpoint on two nodes again.
    cluster.worker = cluster.add_node(num_cpus=1)
    resumed = jobs.run(_grpo(two_nodes, *on_cluster), job_env(tmp_path / "outputs"), timeout=300, check=False)
    assert resumed.returncode == 0, resumed.stderr[-6000:]
    log = (two_nodes / "train.log").read_text()
    assert "resumed from" in log
    # The ranks' own node ids, as each rank reported them (logged by the driver at every start).
    placed = [re.findall(r"'([0-9a-f]{12})'", line) for line in log.splitlines() if "worker group:" in line]
    print("ranks' nodes per start:", placed)
    alive = [n.node_id[:12] for n in cluster.list_all_nodes()]
    assert len(placed) == 2 and len(set(placed[0])) == 2 and lost[:12] in placed[0]
    assert sorted(placed[1]) == sorted(alive) and lost[:12] not in placed[1]

    a, b = grpo_3_step_reference.rows(), jobs.metrics(two_nodes)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3]
    jobs.assert_same_metrics(a, b, ("one node", "two nodes"))
    print("metrics equal bitwise over steps 1-3:", {k: [r[k] for r in b] for k in ("critic/score/mean", "actor/pg_loss")})
