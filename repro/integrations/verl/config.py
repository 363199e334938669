"""verl-side configs of the DeepSpeed engine, and their translation into repro's own sections.

:class:`DeepSpeedEngineConfig` is what verl's trainer builds from ``engine/deepspeed.yaml``
(``actor_rollout_ref.actor.deepspeed``, ``...ref.deepspeed``, ``critic.deepspeed``). It declares no
key of its own: it is :class:`~repro.integrations.verl.engine_keys.DeepSpeedEngineKeys` (repro's
:class:`repro.config.DeepSpeedConfig`, whole, plus ``strategy``, ``ulysses_sequence_parallel_size``
and ``dtype``) and verl's ``EngineConfig``. So every DeepSpeed key means what it means in repro and is
validated by repro's one validator (``param_offload`` / ``fp32_grad_accum`` / ``step_each_micro`` left
at null read ``VERL_ENABLE_PARAM_OFFLOAD`` / ``VERL_DS_ZERO2_*``), and the yaml is generated from the
same dataclasses. verl's generic engine keys (``optimizer_offload``, ``dtype``, ...) are accepted where
they agree with the DeepSpeed keys and refused, naming both, where they contradict them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from verl.workers.config import ActorConfig, CriticConfig
from verl.workers.config.engine import EngineConfig
from verl.workers.config.optimizer import OptimizerConfig

from repro.config import LayerKernels, ModelConfig, OptimConfig
from repro.config.ds_config import OffloadPlan
from repro.config.fields import WARMUP_STYLES
from repro.integrations.verl.engine_keys import STRATEGY, DeepSpeedEngineKeys, bad_key, fold_seed_keys


@dataclass
class DeepSpeedEngineConfig(DeepSpeedEngineKeys, EngineConfig):
    """The ``deepspeed`` engine section of a verl role (actor, ref, critic): its keys are
    :class:`DeepSpeedEngineKeys`' (declared there, never here) and verl's ``EngineConfig``'s."""

    _mutable_fields = EngineConfig._mutable_fields | {"ulysses_sequence_parallel_size"}

    def __post_init__(self) -> None:
        EngineConfig.__post_init__(self)
        DeepSpeedEngineKeys.__post_init__(self)

    def check_offload(self, plan: OffloadPlan) -> None:
        # verl's generic offload flag may restate the DeepSpeed keys, never contradict them.
        if self.optimizer_offload and plan.optimizer == "none":
            raise bad_key("optimizer_offload", True, f"contradicts deepspeed.offload={self.offload!r}; "
                          "offload optimizer states with deepspeed.offload=cpu (choices: none, cpu, nvme, auto)")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DeepSpeedEngineConfig:
        """Built from plain keys, refusing an unknown one with the valid choices."""
        known = {f.name for f in fields(cls) if not f.name.startswith("_")}
        for key in values:
            if key not in known:
                raise ValueError(f"deepspeed.{key} is not a key of the DeepSpeed engine; choose from {sorted(known)}")
        return cls(**values)


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
    if schedule not in WARMUP_STYLES:  # verl's name of repro's optim.warmup_style
        raise ValueError(f"optim.lr_scheduler_type={schedule!r} is not valid for the DeepSpeed engine; "
                         f"choose one of {list(WARMUP_STYLES)}")
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


def repro_model(model: Any, *, lora: bool, kernels: LayerKernels | None = None) -> ModelConfig:
    """repro's model section from verl's HFModelConfig (``lora=False``: no adapters, e.g. the critic), with the layer
    keys of the role's engine section (``kernels``; verl's model section has no such keys)."""
    kernels = kernels or LayerKernels()
    return ModelConfig(
        compile_layers=kernels.compile_layers, compile_scope=kernels.compile_scope,
        flash_attention=kernels.flash_attention,
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
    """verl's critic config with the ``deepspeed`` engine section (``critic/deepspeed_critic.yaml``).

    ``deepspeed_config`` and ``ulysses_sequence_parallel_size`` are the seed DeepSpeed PR's spellings
    (``critic.deepspeed_config.zero_stage=3``, ``critic.ulysses_sequence_parallel_size=2``): each set key
    moves into ``deepspeed`` (:func:`~repro.integrations.verl.engine_keys.fold_seed_keys`), the one
    section the engine reads; they declare no key of their own."""

    strategy: str = STRATEGY
    deepspeed: DeepSpeedEngineConfig = None
    grad_clip: float = 1.0
    deepspeed_config: dict[str, Any] | None = None
    ulysses_sequence_parallel_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.strategy != STRATEGY:
            raise ValueError(f"critic.strategy={self.strategy!r} is not valid with model_engine=deepspeed; "
                             f"choose one of {[STRATEGY]}")
        if self.deepspeed is None:
            self.deepspeed = DeepSpeedEngineConfig()
        seed = {f"critic.deepspeed_config.{k}": v for k, v in (self.deepspeed_config or {}).items()}
        seed["critic.ulysses_sequence_parallel_size"] = self.ulysses_sequence_parallel_size
        moved = fold_seed_keys(self.deepspeed, seed)
        if moved:  # rebuilt, not patched: the section's validation runs on the values it will use
            try:
                section = replace(self.deepspeed, **moved)
            except ValueError as err:
                raise ValueError(f"critic.deepspeed_config (the seed's name of critic.deepspeed): {err}") from None
            object.__setattr__(self, "deepspeed", section)  # verl's BaseConfig freezes set fields; as verl does
        self.engine = self.deepspeed
