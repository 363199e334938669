"""Ray worker groups: rank environment, a real gloo group across the Ray actors, fan-out and gather."""

from __future__ import annotations

import pytest

from repro.config import RunConfig
from tests.distributed.cluster.probes import RankProbe


@pytest.fixture(scope="module")
def group(ray_head):
    import ray

    from repro.cluster.worker_group import WorkerGroup, shutdown_ray

    cfg = RunConfig()
    cfg.trainer.n_gpus_per_node = 2
    cfg.trainer.device = "cpu"
    cfg.trainer.ray_address = ray_head
    g = WorkerGroup(cfg, RankProbe, "probe")
    try:
        yield g
    finally:
        g.shutdown()
        shutdown_ray()
        assert not ray.is_initialized()


def test_ranks_get_rank_env_and_form_one_gloo_group(group):
    envs = group.execute_all_same("env")
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"} and [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1 and envs[0]["MASTER_PORT"].isdigit()
    assert {e["DS_ACCELERATOR"] for e in envs} == {"cpu"} and {e["OMP_NUM_THREADS"] for e in envs} == {"1"}
    assert {e["CUDA_VISIBLE_DEVICES"] for e in envs} == {""}  # a CPU rank sees none of its host's GPUs
    assert len({e["pid"] for e in envs}) == 2 and {e["tag"] for e in envs} == {"probe"}
    # Each rank gets its own shard; the collective proves the ranks share one process group.
    assert group.execute_all("all_reduce", [1.0, 10.0]) == [11.0, 11.0]


def test_wrong_number_of_shards_is_refused(group):
    with pytest.raises(ValueError, match="3 shards for 2 ranks"):
        group.execute_all("all_reduce", [1.0, 2.0, 3.0])


def test_an_error_in_one_rank_is_one_line_naming_rank_host_and_message(group):
    from repro.cluster.errors import WorkerError

    with pytest.raises(WorkerError) as e:
        group.execute_all_same("fail_on", 1)
    assert str(e.value) == f"rank 1 on host {group.hosts[1]} failed in fail_on: ValueError: bad shard on rank 1"
    assert "fail_on" in e.value.details and not e.value.died
    assert group.execute_all_same("fail_on", 5) == [5, 5], "the group is usable after a rank's error"


def test_more_nodes_than_the_cluster_has_alive_are_refused(group):
    import ray

    from repro.cluster import placement

    nodes = [placement.NodeInfo.from_ray(n) for n in ray.nodes()]
    assert len(placement.check_nodes(nodes, 1, 1, {"CPU": 0.01}, None)) == 1
    with pytest.raises(placement.PlacementError, match="trainer.nnodes=2 .* needs 2 such nodes but 1 of"):
        placement.check_nodes(nodes, 2, 1, {"CPU": 0.01}, "auto")
