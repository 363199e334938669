"""Where the ranks of a run go on a Ray cluster: one bundle per node, every bundle on its own node.

``trainer.nnodes=N`` with ``trainer.n_gpus_per_node=G`` means N distinct machines with G ranks
each. Ray has no "spread these groups of bundles" strategy, so a node is one bundle holding the
resources of its G ranks, and the N bundles form one ``STRICT_SPREAD`` placement group: Ray puts
no two of them on the same node, and the G rank actors of node ``k`` are all scheduled into
bundle ``k``. Rank ``r`` is local rank ``r % G`` on node ``r // G``.

Before anything is reserved, :func:`check_nodes` counts the alive nodes that can hold one node's
bundle and refuses the run with one line (``PlacementError``, exit 2 from the CLI) when there are
fewer than ``trainer.nnodes``, naming the nodes that are dead or too small. A multi-node run
without a cluster to join (``trainer.ray_address`` or ``RAY_ADDRESS``) is refused too: a fresh
local Ray instance is one machine.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class PlacementError(ValueError):
    """The cluster cannot hold the ranks as configured (a config error: the CLI exits 2)."""


def cluster_address(ray_address: str | None) -> str | None:
    """The cluster a run joins: ``trainer.ray_address``, else ``$RAY_ADDRESS``, else None (start one)."""
    return ray_address or os.environ.get("RAY_ADDRESS") or None


def require_cluster_for_nodes(nnodes: int, address: str | None) -> None:
    """``trainer.nnodes>1`` needs an existing cluster: a local instance would put every rank here."""
    if nnodes > 1 and not address:
        raise PlacementError(
            f"trainer.nnodes={nnodes} needs a Ray cluster of {nnodes} nodes: set trainer.ray_address "
            "(or RAY_ADDRESS) to it; without one every rank would run on this machine"
        )


def rank_cpus(cluster_cpus: float, world: int) -> float:
    """CPU share of one CPU rank: at most half a core, and all ranks fit beside the driver.

    Rounded down to 1/100 so that G actors of a share fit a bundle of G shares exactly (Ray
    keeps resources in fixed point).
    """
    return max(0.01, math.floor(min(0.5, cluster_cpus / (world + 1)) * 100) / 100)


def node_bundle(rank_bundle: Mapping[str, float], per_node: int) -> dict[str, float]:
    """The resources of one node's ``per_node`` ranks, as one placement-group bundle."""
    return {k: round(v * per_node, 4) for k, v in rank_bundle.items()}


@dataclass(frozen=True)
class NodeInfo:
    """One Ray node as ``ray.nodes()`` describes it."""

    node_id: str
    ip: str
    alive: bool
    resources: dict[str, float]

    @classmethod
    def from_ray(cls, raw: Mapping[str, Any]) -> NodeInfo:
        return cls(node_id=str(raw.get("NodeID", "")), ip=str(raw.get("NodeManagerAddress", "")),
                   alive=bool(raw.get("Alive")), resources=dict(raw.get("Resources") or {}))

    def fits(self, bundle: Mapping[str, float]) -> bool:
        return self.alive and all(self.resources.get(k, 0.0) >= v for k, v in bundle.items())

    def describe(self) -> str:
        if not self.alive:
            return f"{self.node_id[:12]} ({self.ip}, dead)"
        have = {k: v for k, v in sorted(self.resources.items()) if k in ("CPU", "GPU")}
        return f"{self.node_id[:12]} ({self.ip}, alive, {have})"


def check_nodes(nodes: Sequence[NodeInfo], nnodes: int, per_node: int, bundle: Mapping[str, float],
                address: str | None) -> list[NodeInfo]:
    """The alive nodes that can hold one node's ranks; ``PlacementError`` when fewer than ``nnodes``."""
    fit = [n for n in nodes if n.fits(bundle)]
    if len(fit) >= nnodes:
        return fit
    others = [n for n in nodes if n not in fit]
    dead = [n for n in others if not n.alive]
    small = [n for n in others if n.alive]
    where = f"the Ray cluster at {address}" if address else "the local Ray instance"
    parts = [f"{len(fit)} of {where}'s nodes can hold {per_node} rank(s) ({dict(bundle)})"]
    if dead:
        parts.append("lost (dead): " + ", ".join(n.describe() for n in dead))
    if small:
        parts.append("too small: " + ", ".join(n.describe() for n in small))
    raise PlacementError(
        f"trainer.nnodes={nnodes} x trainer.n_gpus_per_node={per_node} needs {nnodes} such nodes but "
        + "; ".join(parts) + "; add nodes or lower trainer.nnodes / trainer.n_gpus_per_node"
    )


def check_spread(node_ids: Sequence[str], nnodes: int, per_node: int) -> None:
    """The ranks as placed: node ``k``'s ranks share a node id, and no two nodes share one."""
    groups = [node_ids[k * per_node:(k + 1) * per_node] for k in range(nnodes)]
    firsts = [g[0] for g in groups]
    if any(len(set(g)) != 1 for g in groups) or len(set(firsts)) != nnodes:
        raise RuntimeError(f"ranks were not placed on {nnodes} distinct nodes of {per_node}: {list(node_ids)}")


class NodeLostError(RuntimeError):
    """A node holding ranks died during a call; the run cannot go on without it (resume it later)."""


def lost_ranks_message(method: str, node_ids: Sequence[str], nodes: Sequence[NodeInfo]) -> str | None:
    """One line naming the ranks whose node ``ray.nodes()`` reports dead (None when all are alive)."""
    dead = {n.node_id: n for n in nodes if not n.alive}
    lost = [(rank, dead[nid]) for rank, nid in enumerate(node_ids) if nid in dead]
    if not lost:
        return None
    who = ", ".join(f"rank {rank} on node {n.node_id[:12]} ({n.ip})" for rank, n in lost)
    return (f"lost {who} during {method}: the node died; bring a node back (or add one) and run the same "
            "command again to resume from the last checkpoint")
