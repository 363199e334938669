"""One DeepSpeed engine of a role: model loading, ``deepspeed.initialize``, the micro-batch loop.

:class:`RoleEngine` owns the engine of one role (actor, critic, frozen reference) and runs a
mini-batch as a sequence of micro-batches with one optimizer update:

- the caller's loss is already normalised by the *whole* mini-batch's counts, so the engine
  calls ``engine.backward(loss, scale_wrt_gas=False)`` and the accumulated gradient equals the
  gradient of the full mini-batch for any split (fixed or token-budget micro-batches);
- the accumulation boundary is set explicitly on every micro-batch (True only on the last),
  because the number of micro-batches can differ from DeepSpeed's nominal GAS;
- ``step_each_micro=False``: one ``engine.step()`` after the last micro-batch;
  ``step_each_micro=True``: ``engine.step()`` after every micro-batch (a no-op update except at
  the boundary). Both give the same update;
- the grad norm is DeepSpeed's cached value from ``step()`` (no extra collective); DeepSpeed
  itself skips an update whose norm is not finite, which is counted.

Both front doors train through it (repro's ``ActorWorker`` with :meth:`RoleEngine.train_mini_batch`,
verl's engine API through ``repro.integrations.verl.engine`` with the parts of one update), so the
one-rank fault of ``REPRO_FAULT_RANK`` (:mod:`repro.workers.faults`) fires here: the caller arms it at
the start of each actor update (:meth:`RoleEngine.arm_fault`), and it fails the forward of the last
micro-batch of that update's first mini-batch.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import resource
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from repro.batching.batch import Batch
from repro.config.ds_config import build_ds_config, resolve_model_dtype
from repro.config.zero3 import model_size_of
from repro.devices import default_device, nvml_used_gb, on_cpu
from repro.workers import faults, rms_norm
from repro.workers.profiling import phase

if TYPE_CHECKING:
    from repro.batching.plan import RoleBatchPlan
    from repro.config import DeepSpeedConfig, ModelConfig, OptimConfig

logger = logging.getLogger(__name__)

# Returns the micro-batch's loss (already weighted by the mini-batch's global counts) and its
# statistics (floats or 0-d tensors, summed by the caller); called once per micro-batch.
LossFn = Callable[[Batch], tuple[torch.Tensor, dict[str, Any]]]


def torch_dtype(ds: DeepSpeedConfig) -> torch.dtype:
    """Parameter dtype of the role's model (``auto``: bf16 on CUDA, fp32 on CPU)."""
    return torch.bfloat16 if resolve_model_dtype(ds.model_dtype, not on_cpu()) == "bfloat16" else torch.float32


def resolve_model_path(path: str) -> str:
    """A built-in policy's name (``tiny``, ...) -> its folder; anything else must be a Hugging Face folder."""
    from repro.data.policies import built_in, is_built_in

    if is_built_in(path):
        return str(built_in(path).ensure())
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"model.path={path!r} is not a Hugging Face model folder (no config.json there)")
    return path


def load_hf_model(model_cfg: ModelConfig, dtype: torch.dtype, *, value_head: bool = False) -> torch.nn.Module:
    """Causal LM (actor, reference) or a one-output token-classification model (critic).

    On CUDA in half precision its RMSNorms run torch's fused kernel (:mod:`repro.workers.rms_norm`).

    The critic is ``AutoModelForTokenClassification`` with ``num_labels=1`` on the same
    backbone: its ``score`` head is new, the backbone loads from the policy's weights, and it
    saves and reloads as a normal Hugging Face model. Its dropout is off so that training is
    deterministic.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    if model_cfg.external_lib:
        importlib.import_module(model_cfg.external_lib)
    path = resolve_model_path(model_cfg.path)
    config = AutoConfig.from_pretrained(path, trust_remote_code=model_cfg.trust_remote_code)
    for key, value in dict(model_cfg.override_config).items():
        setattr(config, key, value)
    if value_head:
        config.num_labels = 1
        config.classifier_dropout = 0.0
        auto = AutoModelForTokenClassification
    else:
        auto = AutoModelForCausalLM
    model = auto.from_pretrained(path, config=config, dtype=dtype, trust_remote_code=model_cfg.trust_remote_code)
    if model_cfg.enable_gradient_checkpointing is True:  # "auto": the first update decides (RoleEngine)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    if rms_norm.supported(dtype):
        rms_norm.enable(model)
    return model


def merge_config(base: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in (nested dicts merged key by key)."""
    out = dict(base)
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_config(out[key], value)
        else:
            out[key] = value
    return out


def memory_metrics() -> dict[str, float]:
    """Peak memory of this process: CUDA allocator (+ NVML) on GPU, max RSS on CPU."""
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB
    out = {"perf/cpu_max_rss_gb": rss_gb}
    if on_cpu():
        out["perf/max_memory_allocated_gb"] = rss_gb
        out["perf/max_memory_reserved_gb"] = rss_gb
        return out
    out["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30
    out["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved() / 2**30
    used = nvml_used_gb()
    if used is not None:
        out["perf/nvml_memory_used_gb"] = used
    return out


@dataclass
class StepResult:
    """Outcome of one mini-batch update."""

    grad_norm: float
    """DeepSpeed's global grad norm of this update (inf/nan when the update was skipped)."""
    lr: float
    """Learning rate the update used."""
    skipped: bool
    """True when no update was applied (non-finite grad norm, or no active micro-batch)."""
    stats: list[dict[str, Any]] = field(default_factory=list)
    """The loss function's statistics, one dict per micro-batch that ran."""
    micro_batches_skipped: int = 0
    """Micro-batches whose forward/backward was skipped as inactive."""


def all_reduce_counts(values: Sequence[float], op: str = "sum") -> list[float]:
    """All-reduce a few numbers at once (one collective; none at world size 1)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [float(v) for v in values]
    dev = default_device()
    tensor = torch.tensor(list(values), dtype=torch.float64 if dev.type == "cpu" else torch.float32, device=dev)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return tensor.tolist()


class RoleEngine:
    """The DeepSpeed engine of one role (or a plain module for a frozen role below ZeRO-3)."""

    def __init__(
        self,
        module: torch.nn.Module,
        ds: DeepSpeedConfig,
        plan: RoleBatchPlan,
        *,
        optim: OptimConfig | None,
        grad_clip: float,
        ds_overrides: dict[str, Any] | None = None,
        mpu: Any = None,
        caller_steps_lr: bool = False,
    ) -> None:
        import deepspeed

        self.trainable = optim is not None
        self.ds = ds
        self.step_each_micro = bool(ds.step_each_micro)
        self.micro_batches_run = 0  # backward passes run (benchmarks divide by updates: micro-batches an update)
        from repro.config import OptimConfig as _Optim

        # ZeRO-3 sizes its buckets from the model's width (repro.config.zero3); the plan reads the same.
        self.ds_config = merge_config(
            build_ds_config(ds, optim or _Optim(), plan, grad_clip=grad_clip, on_cuda=not on_cpu(),
                            trainable=self.trainable,
                            model_size=model_size_of(module) if ds.zero3_size_aware else None),
            ds_overrides,
        )
        # verl's engine API steps the LR schedule itself (once per RL step, lr_scheduler_step);
        # DeepSpeed would step one it owns on every optimizer step. Same schedule, other owner.
        schedule = self.ds_config.pop("scheduler", None) if caller_steps_lr else None
        self.lr_scheduler: Any = None
        """The schedule the caller steps (``caller_steps_lr``); None: DeepSpeed's own, or a constant LR."""
        self.device = default_device()
        self.loaded_step: int | None = None
        """Step of the checkpoint this process loaded (never pruned by a later save)."""
        self.auto_checkpointing_tokens: int | None = None
        """Set by the worker for ``enable_gradient_checkpointing=auto``: tokens of a rank's largest micro-batch; the
        first update decides (:mod:`repro.workers.activation_checkpointing`) and leaves the outcome in ``checkpointing``."""
        self.checkpointing: Any = None
        self.before_step: Callable[[RoleEngine], None] | None = None
        """Called after the last backward of a mini-batch, before its optimizer step (inspection)."""
        self.engine: Any = None
        self._fault: tuple[str, str] | None = None
        """(kind, stage) of an armed ``REPRO_FAULT_RANK`` fault: stage ``armed`` (update begun), ``mini``
        (its first mini-batch), ``fire`` (that mini-batch's last micro-batch: its next forward fails)."""
        from repro.workers.engaged import FedInputs

        self.fed = FedInputs()
        """What the forwards handed the model (shapes; ``report()["fed"]``, reset by the caller)."""
        self.zero3_leaves: list[str] = []
        """Decoder layer classes fetched as ZeRO-3 leaf modules (empty below ZeRO-3 or when off)."""
        from repro.config.zero3 import use_leaves
        from repro.workers.lora import is_lora
        from repro.workers.zero3_leaf import mark_zero3_leaves

        if use_leaves(ds.zero_stage, ds.zero3_leaf_modules, is_lora(module)):
            self.zero3_leaves = mark_zero3_leaves(module)
        if self.trainable:
            params = [p for p in module.parameters() if p.requires_grad]
            self.engine, _, _, _ = deepspeed.initialize(model=module, model_parameters=params, config=self.ds_config,
                                                        mpu=mpu)
            self.module = self.engine.module
            if ds.zero_stage == 3 and ds.zero3_coalesce_persistent_gather:
                from repro.workers.zero3_persist_gather import coalesce

                coalesce(self.engine.optimizer)
            if ds.zero_stage in (1, 2) and ds.fused_overflow_check:
                from repro.workers.overflow_check import fuse

                fuse(self.engine.optimizer)
            if schedule is not None:
                from deepspeed.runtime import lr_schedules

                self.lr_scheduler = getattr(lr_schedules, schedule["type"])(self.engine.optimizer,
                                                                            **schedule["params"])
        elif ds.zero_stage == 3:
            module.requires_grad_(False)
            self.engine, _, _, _ = deepspeed.initialize(model=module, config=self.ds_config, mpu=mpu)
            self.module = self.engine.module
        else:
            # A frozen role below ZeRO-3 gains nothing from an engine: a plain module in eval mode.
            module.requires_grad_(False)
            self.module = module.to(self.device)
        if ds.zero_stage == 3 and ds.zero3_unhook_persistent_modules and self.engine is not None:  # before any forward
            from repro.workers.zero3_persist_hooks import unhook

            unhook(self.engine)
        if ds.memory_efficient_linear is False:  # an earlier ZeRO-3 engine of this process may have replaced it
            from repro.workers.zero3_linear import keep_torch_linear

            keep_torch_linear()
        self.module.eval()

    # ---- forward -------------------------------------------------------------------------
    def forward(self, **inputs: torch.Tensor) -> Any:
        """Forward through the engine (ZeRO-3 gathers parameters) or the plain module."""
        runner = self.engine if self.engine is not None else self.module
        if self._fault is not None and self._fault[1] == "fire":
            kind, self._fault = self._fault[0], None
            vocab = self.module.get_input_embeddings().num_embeddings
            inputs = {**inputs, "input_ids": faults.inject(kind, inputs["input_ids"], vocab, self._rank())}
        self.fed.add(inputs)
        return runner(**inputs)

    def arm_fault(self, update: int) -> None:
        """An actor update begins, the ``update``-th (1-based) of this rank: arm the fault that
        ``REPRO_FAULT_RANK`` plans for this rank and update, if any (:func:`repro.workers.faults.planned`).

        Called by each front door once per actor update: repro's ``ActorWorker.update_policy`` (its
        update counter, kept in its checkpoints) and verl's engine on each ``update_actor``
        (``repro.integrations.verl.engine``, its own counter, kept in its checkpoints). Unset, it
        costs one environment lookup."""
        kind = faults.planned(self._rank(), update)
        self._fault = (kind, "armed") if kind else None

    @staticmethod
    def _rank() -> int:
        return dist.get_rank() if dist.is_initialized() else 0

    def report(self) -> dict[str, Any]:
        """What DeepSpeed, the module and the fed inputs say this role does (``repro.workers.engaged``)."""
        from repro.workers.engaged import engine_report

        return engine_report(self)

    def current_lr(self) -> float:
        return float(self.engine.get_lr()[0]) if self.trainable else 0.0

    # ---- one update ----------------------------------------------------------------------
    def train_mini_batch(self, micro_batches: Sequence[Batch], loss_fn: LossFn,
                         inactive: Sequence[bool] | None = None) -> StepResult:
        """Forward/backward every micro-batch, then one optimizer update.

        ``inactive[i]`` marks micro-batches whose backward may be skipped (no active tokens);
        the caller only passes it where skipping is allowed (see the actor's guard). Skipping
        is rank-local, so in data parallel it desynchronises the ranks' collectives.
        """
        assert self.trainable, "train_mini_batch on a frozen role"
        self._auto_checkpointing()  # before the early return below: every rank takes part in the decision
        run = [i for i in range(len(micro_batches)) if not (inactive and inactive[i])]
        lr = self.current_lr()
        if not run:
            return StepResult(grad_norm=float("nan"), lr=lr, skipped=True, micro_batches_skipped=len(micro_batches))
        self.begin_update()
        stats = []
        for i in run:
            self.start_micro(last=i == run[-1])
            loss, micro_stats = loss_fn(micro_batches[i])
            self.backward_micro(loss, last=i == run[-1])
            stats.append(micro_stats)
        grad_norm, skipped = self.end_update()
        return StepResult(grad_norm=grad_norm, lr=lr, skipped=skipped, stats=stats,
                          micro_batches_skipped=len(micro_batches) - len(run))

    # ---- the parts of one update (train_mini_batch, and verl's engine API: repro.integrations.verl) ----
    def begin_update(self) -> None:
        """Start a mini-batch update: train mode, and the skip counter its outcome is read against."""
        self._auto_checkpointing()
        self.module.train()
        self._skipped_before = self.engine.skipped_steps
        if self._fault is not None:  # the armed update's first mini-batch; none after it
            self._fault = (self._fault[0], "mini") if self._fault[1] == "armed" else None

    def _auto_checkpointing(self) -> None:
        """``auto``: measure, agree over the ranks and turn checkpointing on where needed, once."""
        if self.auto_checkpointing_tokens is None or self.checkpointing is not None:
            return
        from repro.workers import activation_checkpointing as checkpointing

        runner = self.engine if self.engine is not None else self.module

        def probe(n: int) -> Any:  # not through forward(): the probe is no input the report's `fed` should count
            ids = torch.arange(n, device=self.device).unsqueeze(0)
            return runner(input_ids=ids % self.module.get_input_embeddings().num_embeddings, position_ids=ids)

        self.checkpointing = checkpointing.decide(probe, self.module, self.device, self.auto_checkpointing_tokens)
        if self.checkpointing.on:
            checkpointing.enable(self.module)
        if self._rank() == 0:
            print(self.checkpointing.line(), flush=True)

    def checkpointing_metrics(self, prefix: str) -> dict[str, float]:
        """``{prefix}/gradient_checkpointing``: 1 or 0 as ``auto`` chose (absent without ``auto``), so that the run's
        metrics, not only rank 0's console, keep the choice."""
        return {f"{prefix}/gradient_checkpointing": float(self.checkpointing.on)} if self.checkpointing else {}

    def start_micro(self, *, last: bool) -> None:
        """Before a micro-batch's forward: whether its backward ends the accumulation."""
        # Set on every micro-batch: the count may differ from DeepSpeed's nominal GAS.
        self.engine.set_gradient_accumulation_boundary(last)
        if last and self._fault is not None and self._fault[1] == "mini":
            self._fault = (self._fault[0], "fire")

    def backward_micro(self, loss: torch.Tensor, *, last: bool) -> None:
        """Backward of one micro-batch's (globally normalised) loss, after :meth:`start_micro`."""
        self.engine.backward(loss, scale_wrt_gas=False)
        self.micro_batches_run += 1
        if last and self.before_step is not None:
            self.before_step(self)
        if self.step_each_micro:
            with phase("optimizer"):
                self.engine.step()

    def end_update(self) -> tuple[float, bool]:
        """The optimizer step (unless stepped per micro-batch); ``(grad_norm, skipped)``."""
        engine = self.engine
        if not self.step_each_micro:
            with phase("optimizer"):
                engine.step()
        self.module.eval()
        norm = engine.get_global_grad_norm()
        grad_norm = float(norm.item() if torch.is_tensor(norm) else norm) if norm is not None else float("nan")
        skipped = engine.skipped_steps > self._skipped_before or not math.isfinite(grad_norm)
        return grad_norm, skipped
