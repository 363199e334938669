"""Ray worker groups: one Ray actor per GPU (or per CPU rank), placed, wired and fanned out to.

``WorkerGroup(cfg, cls)`` reserves ``trainer.nnodes`` placement groups of
``trainer.n_gpus_per_node`` bundles each (one bundle = one rank: a GPU and a CPU, or a fraction
of a CPU when there is no GPU), starts one Ray actor of ``cls`` per bundle with the rank
environment DeepSpeed reads (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``; ``DS_ACCELERATOR=cpu`` on CPU), and calls methods on all ranks at once.

The hosted class is a plain Python class (``repro.workers.hybrid.HybridWorker``); Ray is only the
transport and the placement. ``ray.init()`` starts a local cluster; ``trainer.ray_address``
joins an existing one, which is how a run spans nodes. The master port is picked by rank 0 on
its own node after the actors exist, then handed to every rank before any process group forms.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from repro.config import RunConfig
from repro.devices import on_cpu
from repro.interrupts import reclaim_sigterm
from repro.preflight import alive_ray_nodes, check_nodes, ray_address
from repro.worker_errors import gather

log = logging.getLogger("repro.trainer")

# Environment the ranks need even on a remote cluster (a local one inherits the driver's).
_PASS_PREFIXES = ("REPRO_", "VERL_", "NCCL_", "TORCH_", "NVSHMEM_", "DS_", "HF_", "TRANSFORMERS_", "CUDA_LAUNCH")
_PLACEMENT_TIMEOUT_S = 120.0


def use_gpu(cfg: RunConfig) -> bool:
    """Whether ranks get GPUs: ``trainer.device``, or auto = CUDA visible on the driver."""
    device = cfg.trainer.device
    if device == "auto":
        return not on_cpu()
    return device == "cuda"


def start_ray(cfg: RunConfig) -> None:
    """``ray.init`` once: local (explicit CPUs, no dashboard) or ``trainer.ray_address``; then
    ``trainer.nnodes`` is checked against the cluster's alive nodes (``repro.preflight.check_nodes``)."""
    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True, "configure_logging": False}
    if cfg.trainer.ray_address:
        kwargs["address"] = cfg.trainer.ray_address
    else:
        kwargs["num_cpus"] = os.cpu_count() or 1
    kwargs.update(dict(cfg.ray_kwargs.ray_init))
    if kwargs.get("address") and "num_cpus" in cfg.ray_kwargs.ray_init:
        raise ValueError("ray_kwargs.ray_init.num_cpus cannot be set when joining a cluster (trainer.ray_address)")
    ray.init(**kwargs)
    reclaim_sigterm()
    check_nodes(cfg.trainer.nnodes, ray_address(cfg), alive_ray_nodes())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class _RankHost:
    """The Ray actor: sets the rank environment, then hosts one instance of the worker class."""

    def __init__(self, cls: type, args: tuple, kwargs: dict) -> None:
        if os.environ.get("REPRO_GPU_ISOLATED") == "1":
            # Ray gives the actor one GPU through CUDA_VISIBLE_DEVICES: it is device 0 here.
            os.environ["LOCAL_RANK"] = "0"
        self._cls, self._args, self._kwargs = cls, args, kwargs
        self.inner: Any = None

    def address(self) -> tuple[str, int]:
        return ray.util.get_node_ip_address(), _free_port()

    def set_master(self, addr: str, port: int) -> None:
        os.environ["MASTER_ADDR"] = addr
        os.environ["MASTER_PORT"] = str(port)

    def create(self) -> None:
        self.inner = self._cls(*self._args, **self._kwargs)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, method)(*args, **kwargs)


class WorkerGroup:
    """``world`` Ray actors, each hosting ``cls(*args, **kwargs)`` as one rank."""

    def __init__(self, cfg: RunConfig, cls: type, *args: Any, **kwargs: Any) -> None:
        start_ray(cfg)
        self.cfg = cfg
        self.gpu = use_gpu(cfg)
        self.per_node = cfg.trainer.n_gpus_per_node
        self.nnodes = cfg.trainer.nnodes
        self.world = self.per_node * self.nnodes
        bundle = self._bundle()
        self._check_resources(bundle)
        self._pgs = [placement_group([dict(bundle)] * self.per_node, strategy="STRICT_PACK")
                     for _ in range(self.nnodes)]
        try:
            ray.get([pg.ready() for pg in self._pgs], timeout=_PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            self._remove_pgs()
            raise ValueError(
                f"trainer.nnodes={self.nnodes} x trainer.n_gpus_per_node={self.per_node} ranks need "
                f"{self.nnodes} node(s) with {self.per_node} x {bundle} each, but the Ray cluster has "
                f"{ray.cluster_resources()}; lower trainer.n_gpus_per_node / trainer.nnodes"
            ) from None
        remote_cls = ray.remote(_RankHost)
        self.actors = []
        for rank in range(self.world):
            node, local = divmod(rank, self.per_node)
            env = self._rank_env(rank, local)
            self.actors.append(
                remote_cls.options(
                    num_cpus=bundle["CPU"],
                    num_gpus=bundle.get("GPU", 0),
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=self._pgs[node], placement_group_bundle_index=local
                    ),
                    runtime_env={"env_vars": env},
                    name=None,
                ).remote(cls, args, kwargs)
            )
        addresses = ray.get([a.address.remote() for a in self.actors])
        self.hosts = [ip for ip, _ in addresses]
        addr, port = addresses[0]
        ray.get([a.set_master.remote(addr, port) for a in self.actors])
        # Workers build process groups in their constructors: every rank must start together.
        gather([a.create.remote() for a in self.actors], "create", self.hosts)
        log.info("worker group: %d rank(s) on %d node(s), %s, master %s:%d",
                 self.world, self.nnodes, "GPU" if self.gpu else "CPU", addr, port)

    def _bundle(self) -> dict[str, float]:
        if self.gpu:
            return {"CPU": 1.0, "GPU": 1.0}
        total = ray.cluster_resources().get("CPU", 1.0)
        # A CPU rank claims a share so that every rank fits beside the driver on a small machine;
        # OMP_NUM_THREADS=1 is what actually keeps ranks from oversubscribing the cores.
        return {"CPU": max(0.01, min(0.5, total / (self.world + 1)))}

    def _check_resources(self, bundle: dict[str, float]) -> None:
        """Fail at once (not after the placement timeout) when the cluster cannot hold the ranks."""
        have = ray.cluster_resources()
        for key, per_rank in bundle.items():
            if have.get(key, 0.0) < per_rank * self.world:
                raise ValueError(
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
        return env

    # ---- fan-out -------------------------------------------------------------------------
    def execute_all(self, method: str, *per_rank_args: Sequence[Any], **same_kwargs: Any) -> list[Any]:
        """Call ``method`` on every rank; positional argument ``i`` is a list with one item per rank."""
        for i, arg in enumerate(per_rank_args):
            if len(arg) != self.world:
                raise ValueError(f"execute_all({method!r}): argument {i} has {len(arg)} shards for {self.world} ranks")
        refs = [a.call.remote(method, *(arg[r] for arg in per_rank_args), **same_kwargs)
                for r, a in enumerate(self.actors)]
        return gather(refs, method, self.hosts)

    def execute_all_same(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` with the same arguments on every rank."""
        arg_refs = [ray.put(a) for a in args]
        return gather([a.call.remote(method, *arg_refs, **kwargs) for a in self.actors], method, self.hosts)

    def _remove_pgs(self) -> None:
        for pg in self._pgs:
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - best effort while tearing down
                pass

    def shutdown(self) -> None:
        """Kill the rank actors and free their placement groups."""
        for a in getattr(self, "actors", []):
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001
                pass
        self.actors = []
        self._remove_pgs()


def shutdown_ray() -> None:
    if ray.is_initialized():
        ray.shutdown()
    sys.stdout.flush()
