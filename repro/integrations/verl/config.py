"""verl-side configs of the DeepSpeed engine, and their translation into repro's own sections.

:class:`DeepSpeedEngineConfig` is what verl's trainer builds from ``engine/deepspeed.yaml``
(``actor_rollout_ref.actor.deepspeed``, ``...ref.deepspeed``, ``critic.deepspeed``). Its DeepSpeed
keys are repro's :class:`repro.config.DeepSpeedConfig` keys with repro's meaning (``zero_stage``,
``offload`` with the stage-aware rule, ``param_offload`` / ``fp32_grad_accum`` /
``step_each_micro`` left at null read ``VERL_ENABLE_PARAM_OFFLOAD`` / ``VERL_DS_ZERO2_*``), and
:meth:`DeepSpeedEngineConfig.repro_deepspeed` hands them to repro's one validator and knob
reader, so nothing here re-decides them. verl's generic engine keys (``optimizer_offload``,
``dtype``, ...) are accepted where they agree with the DeepSpeed keys and refused, naming both,
where they contradict them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from verl.workers.config import ActorConfig, CriticConfig
from verl.workers.config.engine import EngineConfig
from verl.workers.config.optimizer import OptimizerConfig

from repro.config import DeepSpeedConfig, ModelConfig, OptimConfig, resolve_env_knobs
from repro.config.ds_config import resolve_offload

STRATEGY = "deepspeed"
# verl's optimizer config names the schedule ``lr_scheduler_type`` (``warmup_style`` is its
# deprecated alias); repro's DeepSpeed builder knows these three.
_SCHEDULES = ("constant", "cosine", "linear")
# verl's EngineConfig.dtype values -> repro's DeepSpeedConfig.model_dtype.
_DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float32": "float32", "fp32": "float32"}


def _bad(key: str, value: Any, detail: str) -> ValueError:
    return ValueError(f"deepspeed.{key}={value!r} {detail}")


@dataclass
class DeepSpeedEngineConfig(EngineConfig):
    """The ``deepspeed`` engine section of a verl role (actor, ref, critic)."""

    _mutable_fields = EngineConfig._mutable_fields | {"ulysses_sequence_parallel_size"}

    strategy: str = STRATEGY
    zero_stage: int = 2
    offload: str = "none"
    offload_dir: str | None = None
    param_offload: bool | None = None
    fp32_grad_accum: bool | None = None
    step_each_micro: bool | None = None
    model_dtype: str = "auto"
    torch_adam: bool | None = None
    zero3_leaf_modules: bool = True
    reduce_bucket_size: int | None = None
    allgather_bucket_size: int = 500_000_000
    ulysses_sequence_parallel_size: int = 1
    dtype: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.strategy != STRATEGY:
            raise _bad("strategy", self.strategy, f"is not valid for this engine; choose one of {[STRATEGY]}")
        if self.dtype is not None and self.dtype not in _DTYPES:
            raise _bad("dtype", self.dtype, f"is not valid; choose one of {sorted(_DTYPES)}")
        if self.dtype is not None and self.model_dtype != "auto" and _DTYPES[self.dtype] != self.model_dtype:
            raise _bad("dtype", self.dtype, f"contradicts deepspeed.model_dtype={self.model_dtype!r}; set one of them")
        if not isinstance(self.ulysses_sequence_parallel_size, int) or self.ulysses_sequence_parallel_size < 1:
            raise _bad("ulysses_sequence_parallel_size", self.ulysses_sequence_parallel_size, "must be an integer >= 1")
        ds = self.repro_deepspeed()  # repro's validation of every DeepSpeed key (one clear line each)
        plan = resolve_offload(ds.zero_stage, ds.offload, bool(ds.param_offload), ds.offload_dir)
        # verl's generic offload flags may restate the DeepSpeed keys, never contradict them.
        if self.optimizer_offload and plan.optimizer == "none":
            raise _bad("optimizer_offload", True, f"contradicts deepspeed.offload={self.offload!r}; "
                       "offload optimizer states with deepspeed.offload=cpu (choices: none, cpu, nvme, auto)")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DeepSpeedEngineConfig:
        """Built from plain keys, refusing an unknown one with the valid choices."""
        known = {f.name for f in fields(cls) if not f.name.startswith("_")}
        for key in values:
            if key not in known:
                raise ValueError(f"deepspeed.{key} is not a key of the DeepSpeed engine; choose from {sorted(known)}")
        return cls(**values)

    def repro_deepspeed(self) -> DeepSpeedConfig:
        """repro's DeepSpeed section with these keys, env knobs read (``resolve_env_knobs``)."""
        dtype = self.model_dtype if self.dtype is None or self.model_dtype != "auto" else _DTYPES[self.dtype]
        try:
            ds = DeepSpeedConfig(
                zero_stage=self.zero_stage, offload=self.offload, offload_dir=self.offload_dir, model_dtype=dtype,
                param_offload=self.param_offload, fp32_grad_accum=self.fp32_grad_accum,
                step_each_micro=self.step_each_micro, torch_adam=self.torch_adam,
                zero3_leaf_modules=self.zero3_leaf_modules, reduce_bucket_size=self.reduce_bucket_size,
                allgather_bucket_size=self.allgather_bucket_size,
            )
        except ValueError as err:  # repro names the field as DeepSpeedConfig.<key>: name it as verl's key
            raise ValueError(str(err).replace("DeepSpeedConfig.", "deepspeed.")) from None
        return resolve_env_knobs(ds)


def deepspeed_engine_config(**values: Any) -> DeepSpeedEngineConfig:
    """The yaml's ``_target_``: an unknown key is one line naming it and the valid keys (not a TypeError)."""
    return DeepSpeedEngineConfig.from_dict(values)


@dataclass
class DeepSpeedOptimizerConfig(OptimizerConfig):
    """verl's optimizer section for the DeepSpeed engine (``optim/deepspeed.yaml``): DeepSpeed's AdamW."""

    optimizer: str = "AdamW"
    eps: float = 1e-8
    lr_scheduler_type: str = "constant"
    warmup_style: str | None = None
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        repro_optim(self)  # one clear line for an unknown optimizer or schedule, at config time


def repro_optim(optim: Any) -> tuple[OptimConfig, float]:
    """repro's optimizer section and the grad clip from verl's ``optim`` config (any OptimizerConfig)."""
    schedule = getattr(optim, "lr_scheduler_type", None) or getattr(optim, "warmup_style", None) or "constant"
    if schedule not in _SCHEDULES:
        raise ValueError(f"optim.lr_scheduler_type={schedule!r} is not valid for the DeepSpeed engine; "
                         f"choose one of {list(_SCHEDULES)}")
    name = str(getattr(optim, "optimizer", "AdamW")).lower()
    if name != "adamw":
        raise ValueError(f"optim.optimizer={optim.optimizer!r} is not valid for the DeepSpeed engine; "
                         "choose one of ['AdamW']")
    warmup = getattr(optim, "lr_warmup_steps", -1)
    out = OptimConfig(
        lr=float(optim.lr), lr_warmup_steps=-1 if warmup is None else int(warmup),
        lr_warmup_steps_ratio=float(optim.lr_warmup_steps_ratio), warmup_style=schedule,
        min_lr_ratio=float(getattr(optim, "min_lr_ratio", 0.0) or 0.0), weight_decay=float(optim.weight_decay),
        betas=[float(b) for b in optim.betas], eps=float(getattr(optim, "eps", 1e-8)),
        total_training_steps=int(optim.total_training_steps),
    )
    clip = optim.grad_clip if getattr(optim, "grad_clip", None) is not None else optim.clip_grad
    return out, float(clip)


def repro_model(model: Any, *, lora: bool) -> ModelConfig:
    """repro's model section from verl's HFModelConfig (``lora=False``: no adapters, e.g. the critic)."""
    return ModelConfig(
        path=model.local_path or model.path, trust_remote_code=bool(model.trust_remote_code),
        external_lib=model.external_lib, override_config=dict(model.override_config or {}),
        enable_gradient_checkpointing=bool(model.enable_gradient_checkpointing),
        lora_rank=int(model.lora_rank) if lora else 0, lora_alpha=int(model.lora_alpha),
        target_modules=model.target_modules, exclude_modules=model.exclude_modules,
    )


@dataclass
class DeepSpeedActorConfig(ActorConfig):
    """verl's actor/ref config with the ``deepspeed`` engine section (``actor/deepspeed_actor.yaml``)."""

    strategy: str = STRATEGY
    deepspeed: DeepSpeedEngineConfig = None
    grad_clip: float = 1.0
    use_remove_padding: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.strategy != STRATEGY:
            raise ValueError(f"actor.strategy={self.strategy!r} is not valid with model_engine=deepspeed; "
                             f"choose one of {[STRATEGY]}")
        if self.deepspeed is None:
            self.deepspeed = DeepSpeedEngineConfig()
        self.engine = self.deepspeed  # what verl's engine workers read


@dataclass
class DeepSpeedCriticConfig(CriticConfig):
    """verl's critic config with the ``deepspeed`` engine section (``critic/deepspeed_critic.yaml``)."""

    strategy: str = STRATEGY
    deepspeed: DeepSpeedEngineConfig = None
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.strategy != STRATEGY:
            raise ValueError(f"critic.strategy={self.strategy!r} is not valid with model_engine=deepspeed; "
                             f"choose one of {[STRATEGY]}")
        if self.deepspeed is None:
            self.deepspeed = DeepSpeedEngineConfig()
        self.engine = self.deepspeed
