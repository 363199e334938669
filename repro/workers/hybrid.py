"""One rank of the colocated ("hybrid engine") layout: actor, reference, critic and rollout together.

All roles of a rank live in one process on one device, so the rollout's inference copy is
refreshed in-process from the actor's gathered weights (``iter_full_weights``; a collective at
ZeRO-3, which is why every rank syncs at the same point). The class knows nothing of Ray:
``repro.cluster.worker_group.WorkerGroup`` hosts one per rank, and the multi-rank test harness can too.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from typing import Any

import torch

from repro.batching.batch import Batch
from repro.config import RunConfig, critic_enabled, ref_policy_used
from repro.devices import nvml_used_gb
from repro.workers import lora


def sampling_seed(seed: int, step: int, rank: int, purpose: str = "train") -> int:
    """The rollout seed of one rank at one step: reproducible, distinct across steps and ranks."""
    digest = hashlib.sha256(f"repro.rollout:{purpose}:{seed}:{step}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def _quiet_libraries() -> None:
    """Rank output reaches the driver's terminal through Ray: keep library chatter out of it."""
    import warnings

    import transformers

    level = os.environ.get("REPRO_DS_LOG_LEVEL", "WARNING")
    for name in ("DeepSpeed", "deepspeed"):
        logging.getLogger(name).setLevel(level)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    # torch.distributed deprecation notices raised inside DeepSpeed's ZeRO code, once per call site.
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")


class HybridWorker:
    """Actor (+ reference) + optional critic + rollout of one rank."""

    def __init__(self, cfg: RunConfig) -> None:
        from repro.cluster.process_group import init_distributed
        from repro.workers.actor import ActorWorker
        from repro.workers.rollout_hf import make_rollout

        _quiet_libraries()
        init_distributed()
        self.cfg = cfg
        self.rank = torch.distributed.get_rank()
        self.actor = ActorWorker(cfg, role="actor")
        # A LoRA actor is its own reference: the base model with the adapters disabled.
        self.ref_in_actor = lora.enabled(cfg.actor_rollout_ref.model)
        self.ref = ActorWorker(cfg, role="ref") if ref_policy_used(cfg) and not self.ref_in_actor else None
        self.critic = None
        if critic_enabled(cfg):
            from repro.workers.critic import CriticWorker

            self.critic = CriticWorker(cfg)
        self.rollout = make_rollout(cfg)
        self._nvml_peak = 0.0
        self._infer_mfu: float | None = None
        self._profiler: Any = None

    def engine_setup(self) -> dict[str, dict[str, Any]]:
        """Per role with an engine of its own: what DeepSpeed and the module report once built
        (ZeRO stage, placement, leaves, LoRA, SP: ``repro.workers.engaged``), and under ``rollout``
        the rollout class and engine built. The run's banner shows these, not what the config asked."""
        from repro.workers.engaged import rollout_report

        out: dict[str, dict[str, Any]] = {}
        for role, worker in (("actor", self.actor), ("ref", self.ref), ("critic", self.critic)):
            if worker is not None and worker.engine.engine is not None:
                out[role] = worker.engine.report()
        out["rollout"] = rollout_report(self.rollout)
        return out

    # ---- rollout ---------------------------------------------------------------------------
    def sync_weights(self, version: int) -> int:
        """Copy the actor's current weights into the inference copy (all ranks together)."""
        return self.rollout.load_weights(self.actor.iter_full_weights(), version=version)

    def generate(self, prompt_ids: list[list[int]], n: int, seed: int, step: int,
                 purpose: str = "train", **kwargs: Any) -> Batch:
        out = self.rollout.generate(prompt_ids, n, seed=sampling_seed(seed, step, self.rank, purpose), **kwargs)
        self._sample_nvml()
        return out

    # ---- actor / reference / critic ----------------------------------------------------------
    def compute_log_prob(self, batch: Batch) -> Batch:
        start = time.perf_counter()
        out = self.actor.compute_log_prob(batch, calculate_entropy=True)
        # Reported with the step's actor update (verl's perf/mfu/actor_infer): the log-prob output is tensors only.
        self._infer_mfu = self._mfu(self.actor.engine, batch, time.perf_counter() - start, forward_only=True)
        return out

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        if self.ref_in_actor:
            return self.actor.compute_log_prob(batch, without_adapters=True)
        assert self.ref is not None, "reference policy requested but no KL term is configured"
        return self.ref.compute_log_prob(batch)

    def compute_values(self, batch: Batch) -> Batch:
        assert self.critic is not None, "values requested but the critic is disabled"
        return self.critic.compute_values(batch)

    def update_actor(self, batch: Batch) -> dict[str, float]:
        from repro.workers.placement import placement_metrics

        start = time.perf_counter()
        metrics = self.actor.update_policy(batch)
        metrics["perf/mfu/actor"] = self._mfu(self.actor.engine, batch, time.perf_counter() - start,
                                              self.cfg.actor_rollout_ref.actor.ppo_epochs)
        if self._infer_mfu is not None:
            metrics["perf/mfu/actor_infer"] = self._infer_mfu
        self._sample_nvml()
        # Read from the engine each step (a few attribute reads) so every metrics row carries it.
        metrics.update(placement_metrics(self.actor.engine.engine))
        return self._with_memory(metrics)

    def update_critic(self, batch: Batch) -> dict[str, float]:
        assert self.critic is not None, "critic update requested but the critic is disabled"
        start = time.perf_counter()
        metrics = self.critic.update_critic(batch)
        metrics["perf/mfu/critic"] = self._mfu(self.critic.engine, batch, time.perf_counter() - start,
                                               self.cfg.critic.ppo_epochs)
        self._sample_nvml()
        return self._with_memory(metrics)

    def _mfu(self, engine: Any, batch: Batch, seconds: float, epochs: int = 1, forward_only: bool = False) -> float:
        """This rank's MFU over ``batch`` (``repro.rl.mfu``); the driver averages the ranks."""
        from repro.rl.mfu import device_name, mfu

        seqlens = batch["attention_mask"].sum(dim=-1).tolist() * epochs
        return mfu(getattr(engine.module, "config", None), seqlens, seconds, device_name(engine.device),
                   forward_only=forward_only)

    def _sample_nvml(self) -> None:
        used = nvml_used_gb()
        # A vLLM rollout sleeps before generate returns: its awake reading is the peak.
        awake = getattr(self.rollout, "awake_nvml_gb", None)
        if used is not None and awake is not None:
            used = max(used, awake)
        if used is not None:
            self._nvml_peak = max(self._nvml_peak, used)

    def _with_memory(self, metrics: dict[str, float]) -> dict[str, float]:
        metrics = dict(metrics)
        if self.rollout.device.type == "cuda":
            metrics.setdefault("perf/max_memory_allocated_gb", torch.cuda.max_memory_allocated() / 2**30)
            metrics.setdefault("perf/max_memory_reserved_gb", torch.cuda.max_memory_reserved() / 2**30)
            if self._nvml_peak:
                # The engine reads NVML after the update; the peak also covers generation.
                metrics["perf/nvml_memory_used_gb"] = max(self._nvml_peak, metrics.get("perf/nvml_memory_used_gb", 0.0))
        return metrics

    # ---- profiling ---------------------------------------------------------------------------
    def profile_start(self, out_dir: str, step: int) -> None:
        """Run this rank's part of ``step`` under torch.profiler (``trainer.profile_steps``)."""
        from repro.workers.profiling import StepProfiler

        self._profiler = StepProfiler(out_dir, self.rank)
        roles = [w for w in (self.actor, self.ref, self.critic) if w is not None]
        self._profiler.start(step, models=[w.engine.module for w in roles])

    def profile_stop(self) -> str:
        return str(self._profiler.stop())

    # ---- checkpoints -------------------------------------------------------------------------
    def save_checkpoint(self, root: str, step: int, extra: dict[str, Any]) -> list[str]:
        """Save every trainable role under ``root`` (the driver gives each step its own root)."""
        paths = [self.actor.save_checkpoint(os.path.join(root, "actor"), step, extra)]
        if self.critic is not None:
            paths.append(self.critic.save_checkpoint(os.path.join(root, "critic"), step, {}))
        return paths

    def load_checkpoint(self, root: str) -> dict[str, Any]:
        """Load the checkpoint that ``save_checkpoint(root, ...)`` wrote (one step per root)."""
        extra = self.actor.load_checkpoint(os.path.join(root, "actor"))
        if self.critic is not None:
            self.critic.load_checkpoint(os.path.join(root, "critic"))
        return extra

    def export_hf(self, out_dir: str) -> None:
        self.actor.export_hf(out_dir)
