"""Ray worker groups: one Ray actor per GPU (or per CPU rank), placed, wired and fanned out to.

``WorkerGroup(cfg, cls)`` places ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` ranks (one rank
= a GPU and a CPU, or a fraction of a CPU when there is no GPU) on ``trainer.nnodes`` distinct
Ray nodes (``repro.cluster.placement``: one bundle per node, spread strictly), starts one Ray actor of
``cls`` per rank with the rank environment DeepSpeed reads (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``; ``DS_ACCELERATOR=cpu`` on CPU), and calls methods on all ranks at once.

The hosted class is a plain Python class (``repro.workers.hybrid.HybridWorker``); Ray is only the
transport and the placement. Without ``trainer.ray_address`` / ``RAY_ADDRESS`` a fresh local
instance starts (never a cluster some earlier ``ray start`` left behind); with one the run joins
that cluster, which is how a run spans nodes. ``MASTER_ADDR`` and the master port come from rank
0's node after the actors exist, and reach every rank before any process group forms. Folders
given as ``shared_dirs`` are checked to be shared by every node (``repro.cluster.shared_storage``) before
the hosted class is built.

``REPRO_REUSE_RANKS=1`` (test suites: many short runs on one long-lived single-node CPU cluster
joined through ``RAY_ADDRESS``) keeps the rank processes between runs: named detached actors, each put back
to its pre-run state (``repro.cluster.rank_reset``), killed if the run failed (all, when a call failed).
Every other run starts fresh rank processes and kills them at the end.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from repro.cluster import placement, shared_storage
from repro.cluster.errors import WorkerError, gather
from repro.cluster.ray_reaper import init_ray
from repro.cluster.signals import reclaim_sigterm, sigterm_received
from repro.collectives.launch.launcher import free_port
from repro.config import RunConfig
from repro.devices import on_cpu

log = logging.getLogger("repro.trainer")

# Environment the ranks need even on a remote cluster (a local one inherits the driver's).
_PASS_PREFIXES = ("REPRO_", "VERL_", "NCCL_", "TORCH_", "NVSHMEM_", "DS_", "HF_", "TRANSFORMERS_", "CUDA_LAUNCH")
_PLACEMENT_TIMEOUT_S = 120.0
# How long a failed call waits for the GCS to mark a silent node dead (its health checks take ~15 s).
_NODE_DEATH_WAIT_S = 60.0
# How long the ranks get to answer "are you there?" after a failed call.
_PROBE_S = 3.0
REUSE_ENV = "REPRO_REUSE_RANKS"
_REUSE_NAMESPACE = "repro_reused_ranks"
_RELEASE_S = 30.0
# The first run on a cluster starts the kept processes (Python, imports): slow on a loaded machine.
_BEGIN_S = 120.0


def use_gpu(cfg: RunConfig) -> bool:
    """Whether ranks get GPUs: ``trainer.device``, or auto = CUDA visible on the driver."""
    device = cfg.trainer.device
    if device == "auto":
        return not on_cpu()
    return device == "cuda"


def start_ray(cfg: RunConfig) -> None:
    """``ray.init`` once: local (explicit CPUs, no dashboard) or ``trainer.ray_address``
    (``nnodes>1`` needs the latter; the alive nodes are checked by ``WorkerGroup``)."""
    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True, "configure_logging": False}
    address = placement.cluster_address(cfg.trainer.ray_address)
    placement.require_cluster_for_nodes(cfg.trainer.nnodes, address)
    if address:
        kwargs["address"] = address
    else:
        # "local": without it ray.init() joins whatever cluster /tmp/ray/ray_current_cluster names.
        kwargs["address"] = "local"
        kwargs["num_cpus"] = os.cpu_count() or 1
    kwargs.update(dict(cfg.ray_kwargs.ray_init))
    if address and "num_cpus" in cfg.ray_kwargs.ray_init:
        raise ValueError("ray_kwargs.ray_init.num_cpus cannot be set when joining a cluster (trainer.ray_address)")
    init_ray(kwargs, local=not address)
    reclaim_sigterm()


class _RankHost:
    """The Ray actor: sets the rank environment, then hosts one instance of the worker class."""

    def __init__(self, cls: type | None, args: tuple, kwargs: dict) -> None:
        if os.environ.get("REPRO_GPU_ISOLATED") == "1":
            # Ray gives the actor one GPU through CUDA_VISIBLE_DEVICES: it is device 0 here.
            os.environ["LOCAL_RANK"] = "0"
        self._cls, self._args, self._kwargs = cls, args, kwargs
        self.inner: Any = None
        self._snapshot: Any = None
        self._busy = self._failed = False

    def begin(self, env: dict[str, str], cls: type, args: tuple, kwargs: dict) -> None:
        """A reused rank takes on a new run: its environment and the class to host."""
        from repro.cluster.rank_reset import ProcessSnapshot

        if self._busy:
            raise RuntimeError("this reused rank process is still hosting another run")
        if self._snapshot is None:
            self._snapshot = ProcessSnapshot()
        os.environ.update(env)
        self._cls, self._args, self._kwargs = cls, args, kwargs
        self._busy, self._failed = True, False

    def release(self) -> bool:
        """End a reused rank's run; False (the driver then kills the process) if the run failed here."""
        import torch.distributed as dist

        self.inner = None
        if dist.is_initialized():
            dist.destroy_process_group()
        self._snapshot.restore()
        self._busy = False
        return not self._failed

    def address(self) -> tuple[str, int]:
        return ray.util.get_node_ip_address(), free_port("")

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def probe_shared(self, folder: str, token: str) -> str | None:
        return shared_storage.probe(folder, token, self.node_id())

    def set_master(self, addr: str, port: int) -> None:
        os.environ["MASTER_ADDR"] = addr
        os.environ["MASTER_PORT"] = str(port)

    def create(self) -> None:
        try:
            self.inner = self._cls(*self._args, **self._kwargs)
        except BaseException:
            self._failed = True
            raise

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self.inner, method)(*args, **kwargs)
        except BaseException:
            self._failed = True
            raise


class WorkerGroup:
    """``world`` Ray actors, each hosting ``cls(*args, **kwargs)`` as one rank."""

    def __init__(self, cfg: RunConfig, cls: type, *args: Any,
                 shared_dirs: Sequence[tuple[str, Path]] = (), **kwargs: Any) -> None:
        """``shared_dirs``: (config key, folder) pairs every node must see as one folder."""
        start_ray(cfg)
        self.cfg = cfg
        self.gpu = use_gpu(cfg)
        self.per_node = cfg.trainer.n_gpus_per_node
        self.nnodes = cfg.trainer.nnodes
        self.world = self.per_node * self.nnodes
        self.call_failed = False  # a call raised on some rank: shutdown kills the ranks unasked
        bundle = self._bundle()
        self._check_resources(bundle)
        per_node_bundle = placement.node_bundle(bundle, self.per_node)
        address = placement.cluster_address(cfg.trainer.ray_address)
        nodes = [placement.NodeInfo.from_ray(n) for n in ray.nodes()]
        placement.check_nodes(nodes, self.nnodes, self.per_node, per_node_bundle, address)
        self.reuse = (os.environ.get(REUSE_ENV) == "1" and bool(address) and self.nnodes == 1 and not self.gpu
                      and len(nodes) == 1)
        self._pgs: list[Any] = []
        self.actors = self._reused_actors(cls, args, kwargs) if self.reuse else []
        if not self.actors:
            self.reuse = False
            self.actors = self._fresh_actors(bundle, per_node_bundle, cls, args, kwargs)
        try:
            self._check_nodes_and_storage(shared_dirs)
            addresses = ray.get([a.address.remote() for a in self.actors])
            self.hosts = [ip for ip, _ in addresses]
            addr, port = addresses[0]
            ray.get([a.set_master.remote(addr, port) for a in self.actors])
            # Workers build process groups in their constructors: every rank must start together.
            self._get([a.create.remote() for a in self.actors], "create")
        except BaseException:
            self.shutdown()
            raise
        log.info("worker group: %d rank(s) on %d node(s) %s, %s, master %s:%d%s", self.world, self.nnodes,
                 [n[:12] for n in self.node_ids[::self.per_node]], "GPU" if self.gpu else "CPU", addr, port,
                 f" (reused rank processes, {REUSE_ENV}=1)" if self.reuse else "")

    def _fresh_actors(self, bundle: dict[str, float], per_node_bundle: dict[str, float], cls: type,
                      args: tuple, kwargs: dict) -> list[Any]:
        """One new Ray actor per rank, placed by a placement group (one bundle per node, spread)."""
        self._pgs = [placement_group([per_node_bundle] * self.nnodes, strategy="STRICT_SPREAD")]
        try:
            ray.get([pg.ready() for pg in self._pgs], timeout=_PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            self._remove_pgs()
            raise placement.PlacementError(
                f"trainer.nnodes={self.nnodes} x trainer.n_gpus_per_node={self.per_node} ranks need "
                f"{self.nnodes} node(s) with {self.per_node} x {bundle} each, but the Ray cluster has "
                f"{ray.cluster_resources()}; lower trainer.n_gpus_per_node / trainer.nnodes"
            ) from None
        remote_cls = ray.remote(_RankHost)
        actors = []
        for rank in range(self.world):
            node, local = divmod(rank, self.per_node)
            actors.append(
                remote_cls.options(
                    num_cpus=bundle["CPU"],
                    num_gpus=bundle.get("GPU", 0),
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=self._pgs[0], placement_group_bundle_index=node
                    ),
                    runtime_env={"env_vars": self._rank_env(rank, local)},
                    name=None,
                ).remote(cls, args, kwargs)
            )
        return actors

    def _reused_actors(self, cls: type, args: tuple, kwargs: dict) -> list[Any]:
        """The cluster's kept rank processes (started by the first run that asked for them).

        They claim no CPUs: they outlive runs, and a claim would starve the runs that start fresh
        ranks on the same cluster. OMP_NUM_THREADS=1 keeps them from oversubscribing the cores.
        """
        remote_cls = ray.remote(_RankHost)
        actors = []
        for rank in range(self.world):
            env = self._rank_env(rank, rank)
            # Only what a process needs at its start: the run's own variables come with begin(), and
            # release() puts the process back to this environment.
            start_env = {k: env[k] for k in ("DS_ACCELERATOR", "OMP_NUM_THREADS", "PYTHONPATH")}
            actors.append(remote_cls.options(name=f"rank{rank}", namespace=_REUSE_NAMESPACE, lifetime="detached",
                                             get_if_exists=True, num_cpus=0,
                                             runtime_env={"env_vars": start_env}).remote(None, (), {}))
        refs = [a.begin.remote(self._rank_env(rank, rank), cls, args, kwargs) for rank, a in enumerate(actors)]
        began = []
        for a, ref in zip(actors, refs, strict=True):
            try:
                ray.get(ref, timeout=_BEGIN_S)
                began.append(a)
            except Exception as e:  # noqa: BLE001 - busy (another run holds it) or stuck: leave it be
                log.warning("a reused rank process is busy or unresponsive (%s); this run starts its own ranks",
                            type(e).__name__)
        if len(began) == len(actors):
            return actors
        ray.get([a.release.remote() for a in began], timeout=_RELEASE_S)
        return []

    def _some_rank_unreachable(self) -> bool:
        """Whether a rank's actor is gone; a busy one (blocked in a collective) is not."""
        refs = [a.node_id.remote() for a in self.actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_PROBE_S)
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                return True
        return False

    def _check_nodes_and_storage(self, shared_dirs: Sequence[tuple[str, Path]]) -> None:
        """Ranks sit on distinct nodes as asked, and every node sees ``shared_dirs`` as one folder."""
        self.node_ids: list[str] = ray.get([a.node_id.remote() for a in self.actors])
        placement.check_spread(self.node_ids, self.nnodes, self.per_node)
        firsts = self.actors[::self.per_node]
        for key, folder in shared_dirs:
            shared_storage.check_shared(key, Path(folder), self.node_ids[::self.per_node],
                                        lambda f, t: ray.get([a.probe_shared.remote(f, t) for a in firsts]))

    def _bundle(self) -> dict[str, float]:
        if self.gpu:
            return {"CPU": 1.0, "GPU": 1.0}
        # A CPU rank claims a share so that every rank fits beside the driver on a small machine;
        # OMP_NUM_THREADS=1 is what actually keeps ranks from oversubscribing the cores.
        return {"CPU": placement.rank_cpus(ray.cluster_resources().get("CPU", 1.0), self.world)}

    def _check_resources(self, bundle: dict[str, float]) -> None:
        """Fail at once (not after the placement timeout) when the cluster cannot hold the ranks."""
        have = ray.cluster_resources()
        for key, per_rank in bundle.items():
            if have.get(key, 0.0) < per_rank * self.world:
                raise placement.PlacementError(
                    f"trainer.nnodes={self.nnodes} x trainer.n_gpus_per_node={self.per_node} = {self.world} ranks "
                    f"need {per_rank * self.world:g} {key} in the Ray cluster, which has {have.get(key, 0.0):g}; "
                    + ("lower trainer.n_gpus_per_node or use trainer.device=cpu" if key == "GPU"
                       else "lower trainer.n_gpus_per_node")
                )

    def _rank_env(self, rank: int, local_rank: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k.startswith(_PASS_PREFIXES)}
        repro_root = str(Path(__file__).resolve().parent.parent)
        env.update(
            RANK=str(rank),
            WORLD_SIZE=str(self.world),
            LOCAL_RANK=str(local_rank),
            LOCAL_WORLD_SIZE=str(self.per_node),
            OMP_NUM_THREADS=os.environ.get("REPRO_RANK_THREADS", "1"),
            PYTHONPATH=os.pathsep.join(p for p in (repro_root, os.environ.get("PYTHONPATH", "")) if p),
        )
        if self.gpu:
            env["REPRO_GPU_ISOLATED"] = "1"
            # Explicit, so a driver environment that says cpu (the CPU test suites) cannot leak in.
            env["DS_ACCELERATOR"] = "cuda"
        else:
            env["DS_ACCELERATOR"] = "cpu"
            # A CPU rank sees no GPU of its host (Ray leaves CUDA_VISIBLE_DEVICES alone for actors without
            # one): torch.compile inside a checkpointed layer would initialise CUDA there, and
            # torch.utils.checkpoint refuses a forward that does (seen on a GPU host's CPU test suite).
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    # ---- fan-out -------------------------------------------------------------------------
    def execute_all(self, method: str, *per_rank_args: Sequence[Any], **same_kwargs: Any) -> list[Any]:
        """Call ``method`` on every rank; positional argument ``i`` is a list with one item per rank."""
        for i, arg in enumerate(per_rank_args):
            if len(arg) != self.world:
                raise ValueError(f"execute_all({method!r}): argument {i} has {len(arg)} shards for {self.world} ranks")
        refs = [a.call.remote(method, *(arg[r] for arg in per_rank_args), **same_kwargs)
                for r, a in enumerate(self.actors)]
        return self._get(refs, method)

    def execute_all_same(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` with the same arguments on every rank."""
        arg_refs = [ray.put(a) for a in args]
        return self._get([a.call.remote(method, *arg_refs, **kwargs) for a in self.actors], method)

    def _get(self, refs: list[Any], method: str) -> list[Any]:
        """The ranks' results; a failed rank is one ``WorkerError`` line (``repro.cluster.errors``),
        a rank lost with its node one ``NodeLostError`` line naming the node."""
        try:
            return gather(refs, method, self.hosts)
        except WorkerError as e:
            self.call_failed = True
            if self.nnodes == 1:
                raise  # a lost node would be the driver's own: nothing more to learn
            # The first error may be a survivor's (its collective lost the peer): look for a gone rank.
            if not e.died and not self._some_rank_unreachable():
                raise
            deadline = time.monotonic() + _NODE_DEATH_WAIT_S
            while True:
                nodes = [placement.NodeInfo.from_ray(n) for n in ray.nodes()]
                msg = placement.lost_ranks_message(method, self.node_ids, nodes)
                if msg:
                    raise placement.NodeLostError(msg) from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def _remove_pgs(self) -> None:
        # A synchronous GCS round trip: after a SIGTERM the GCS may be stopping and never answer
        # (repro.cluster.signals); Ray removes a placement group with the driver that made it.
        for pg in [] if sigterm_received() else self._pgs:
            with contextlib.suppress(Exception):  # best effort while tearing down
                remove_placement_group(pg)

    def shutdown(self) -> None:
        """Kill the ranks, free their placement groups; release reused ranks instead unless a call failed or one
        does not answer (a peer waiting in a collective for a failed rank would answer only at the timeout)."""
        if getattr(self, "reuse", False) and self.actors and not getattr(self, "call_failed", True):
            try:
                kept = ray.get([a.release.remote() for a in self.actors], timeout=_RELEASE_S)
            except Exception:  # noqa: BLE001 - a rank that cannot be released is killed below
                kept = [False]
            if all(kept):
                self.actors = []
        killed_names = bool(getattr(self, "reuse", False) and self.actors)
        for a in getattr(self, "actors", []):
            with contextlib.suppress(Exception):  # a rank already gone
                ray.kill(a)
        self.actors = []
        self._remove_pgs()
        if killed_names and not sigterm_received():  # for a next run in this driver (GCS calls)
            _wait_names_released(self.world)


def _wait_names_released(world: int, timeout_s: float = 10.0) -> None:
    """Until killed kept ranks give up their names, so that the next run starts new ones under them."""
    deadline = time.monotonic() + timeout_s
    for rank in range(world):
        while time.monotonic() < deadline:
            try:
                ray.get_actor(f"rank{rank}", namespace=_REUSE_NAMESPACE)
            except ValueError:
                break
            time.sleep(0.1)


def shutdown_ray() -> None:
    if ray.is_initialized():
        ray.shutdown()
    sys.stdout.flush()
