"""Structured run configuration with verl's key names, registered with Hydra's ConfigStore.

The tree mirrors verl's ``ppo_trainer`` config so that the command lines of verl's DeepSpeed PR
work here with ``verl`` replaced by ``repro``. Each dataclass validates itself in
``__post_init__``; cross-section rules (batch splits, critic on/off) live in
:func:`repro.config.rules.validate_run_config`. The DeepSpeed environment knobs are read exactly once, by
:func:`resolve_env_knobs`, and stored in the config so the effective plan shows them.

The package holds one module per group of sections: ``fields`` (valid values, per-field checks),
``engine`` (optimizer, DeepSpeed, checkpoint), ``roles`` (model, actor, reference, rollout,
critic) and ``run`` (algorithm, reward, data, trainer and the root ``RunConfig``); import from
``repro.config``.
"""

from __future__ import annotations

from repro.config.engine import (
    CHECKPOINT_LOAD_CONTENTS,
    CHECKPOINT_REQUIRED,
    CHECKPOINT_SAVE_CONTENTS,
    ENV_FP32_ACCUM,
    ENV_KNOBS,
    ENV_PARAM_OFFLOAD,
    ENV_STEP_EACH_MICRO,
    CheckpointConfig,
    DeepSpeedConfig,
    OptimConfig,
    resolve_env_knobs,
)
from repro.config.fields import (
    ADV_ESTIMATORS,
    DEVICES,
    GSM8K_METHODS,
    KL_LOSS_TYPES,
    LOSS_AGG_MODES,
    MODEL_DTYPES,
    OFFLOAD_CHOICES,
    POLICY_LOSS_MODES,
    REWARD_KWARGS,
    ROLLOUT_NAMES,
    WARMUP_STYLES,
    ZERO_STAGES,
    ConfigFieldError,
)
from repro.config.roles import (
    ActorConfig,
    ActorRolloutRefConfig,
    CriticConfig,
    LayerKernels,
    ModelConfig,
    PolicyLossConfig,
    RefConfig,
    RolloutConfig,
    ValKwargs,
)
from repro.config.run import (
    NO_EFFECT_KEYS,
    AlgorithmConfig,
    CustomRewardFunctionConfig,
    DataConfig,
    KLControlConfig,
    RayKwargs,
    RewardConfig,
    RunConfig,
    TrainerConfig,
    critic_enabled,
    custom_reward,
    ref_policy_used,
)

__all__ = [
    "ZERO_STAGES",
    "OFFLOAD_CHOICES",
    "MODEL_DTYPES",
    "ADV_ESTIMATORS",
    "LOSS_AGG_MODES",
    "KL_LOSS_TYPES",
    "WARMUP_STYLES",
    "ROLLOUT_NAMES",
    "REWARD_KWARGS",
    "GSM8K_METHODS",
    "DEVICES",
    "POLICY_LOSS_MODES",
    "ConfigFieldError",
    "ENV_PARAM_OFFLOAD",
    "ENV_FP32_ACCUM",
    "ENV_STEP_EACH_MICRO",
    "ENV_KNOBS",
    "OptimConfig",
    "DeepSpeedConfig",
    "CHECKPOINT_REQUIRED",
    "CHECKPOINT_SAVE_CONTENTS",
    "CHECKPOINT_LOAD_CONTENTS",
    "CheckpointConfig",
    "resolve_env_knobs",
    "LayerKernels",
    "ModelConfig",
    "PolicyLossConfig",
    "ActorConfig",
    "RefConfig",
    "ValKwargs",
    "RolloutConfig",
    "ActorRolloutRefConfig",
    "CriticConfig",
    "KLControlConfig",
    "AlgorithmConfig",
    "CustomRewardFunctionConfig",
    "RewardConfig",
    "DataConfig",
    "TrainerConfig",
    "RayKwargs",
    "RunConfig",
    "critic_enabled",
    "custom_reward",
    "ref_policy_used",
    "NO_EFFECT_KEYS",
]
