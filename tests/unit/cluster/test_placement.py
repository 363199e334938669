"""Placement arithmetic and the node check: which clusters hold ``nnodes x n_gpus_per_node`` ranks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.cluster.placement import (
    NodeInfo,
    PlacementError,
    check_nodes,
    check_spread,
    cluster_address,
    node_bundle,
    rank_cpus,
    require_cluster_for_nodes,
)


def _node(i: int, cpu: float, gpu: float = 0, alive: bool = True) -> NodeInfo:
    res = {"CPU": cpu} | ({"GPU": gpu} if gpu else {})
    return NodeInfo(node_id=f"{i:02d}" + "ab" * 27, ip=f"10.0.0.{i}", alive=alive, resources=res)


@settings(max_examples=60, deadline=None)
@given(cpus=st.integers(1, 256), world=st.integers(1, 64), per_node=st.integers(1, 8))
def test_rank_share_fits_its_node_bundle_exactly(cpus, world, per_node):
    share = rank_cpus(float(cpus), world)
    assert 0.01 <= share <= 0.5
    # Ray keeps resources in fixed point: per_node actors of `share` fill the bundle, never overflow it.
    assert per_node * share <= node_bundle({"CPU": share}, per_node)["CPU"] + 1e-9
    assert share * world <= max(cpus, 0.01 * world)


@settings(max_examples=60, deadline=None)
@given(gpus=st.lists(st.integers(0, 8), min_size=1, max_size=12), dead=st.sets(st.integers(0, 11)),
       nnodes=st.integers(1, 6), per_node=st.integers(1, 8))
def test_check_nodes_accepts_exactly_when_enough_alive_nodes_fit(gpus, dead, nnodes, per_node):
    nodes = [_node(i, cpu=16, gpu=g, alive=i not in dead) for i, g in enumerate(gpus)]
    bundle = node_bundle({"CPU": 1.0, "GPU": 1.0}, per_node)
    enough = sum(1 for i, g in enumerate(gpus) if i not in dead and g >= per_node) >= nnodes
    if enough:
        fit = check_nodes(nodes, nnodes, per_node, bundle, "10.0.0.1:6379")
        assert len(fit) >= nnodes and all(n.alive and n.resources.get("GPU", 0) >= per_node for n in fit)
    else:
        with pytest.raises(PlacementError, match=f"trainer.nnodes={nnodes} x trainer.n_gpus_per_node={per_node}"):
            check_nodes(nodes, nnodes, per_node, bundle, "10.0.0.1:6379")


def test_refusal_names_the_lost_node_and_the_small_one():
    nodes = [_node(1, cpu=8, gpu=2), _node(2, cpu=8, gpu=2, alive=False), _node(3, cpu=8, gpu=1)]
    with pytest.raises(PlacementError) as e:
        check_nodes(nodes, 2, 2, node_bundle({"CPU": 1.0, "GPU": 1.0}, 2), "10.0.0.1:6379")
    msg = str(e.value)
    assert "\n" not in msg
    assert "1 of the Ray cluster at 10.0.0.1:6379's nodes can hold 2 rank(s)" in msg
    assert f"lost (dead): {nodes[1].node_id[:12]} (10.0.0.2, dead" in msg
    assert f"too small: {nodes[2].node_id[:12]} (10.0.0.3, alive, {{'CPU': 8, 'GPU': 1}})" in msg


def test_multi_node_without_a_cluster_is_refused(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cluster_address(None) is None
    require_cluster_for_nodes(1, None)
    with pytest.raises(PlacementError, match="trainer.nnodes=2 needs a Ray cluster of 2 nodes: set trainer.ray_address"):
        require_cluster_for_nodes(2, cluster_address(None))
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert cluster_address(None) == "10.0.0.1:6379" and cluster_address("h:1") == "h:1"
    require_cluster_for_nodes(2, cluster_address(None))


def test_spread_check_rejects_shared_or_split_nodes():
    check_spread(["a", "a", "b", "b"], 2, 2)
    with pytest.raises(RuntimeError):
        check_spread(["a", "b", "b", "b"], 2, 2)
    with pytest.raises(RuntimeError):
        check_spread(["a", "a", "a", "a"], 2, 2)


def test_lost_ranks_are_named_with_their_node_only_when_a_node_is_dead():
    from repro.cluster.placement import lost_ranks_message

    nodes = [_node(1, cpu=8), _node(2, cpu=8, alive=False)]
    ids = [nodes[0].node_id, nodes[1].node_id, nodes[1].node_id]
    assert lost_ranks_message("update_actor", ids[:1], nodes) is None
    msg = lost_ranks_message("update_actor", ids, nodes)
    assert msg.startswith(f"lost rank 1 on node {nodes[1].node_id[:12]} (10.0.0.2), rank 2 on node ")
    assert "during update_actor: the node died" in msg and "run the same command again to resume" in msg
