"""The run-level sections (algorithm, reward, data, trainer, Ray) and the root :class:`RunConfig`,
with the two questions every layer asks of it: is there a critic, is there a reference policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from repro.config.fields import (
    ADV_ESTIMATORS,
    DEVICES,
    GSM8K_METHODS,
    KL_LOSS_TYPES,
    REWARD_KWARGS,
    _choice,
    _fail,
    _positive,
)
from repro.config.roles import ActorRolloutRefConfig, CriticConfig


@dataclass
class KLControlConfig:
    type: str = "fixed"
    """fixed or adaptive."""
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1

    def __post_init__(self) -> None:
        _choice(self, "type", ("fixed", "adaptive"))


@dataclass
class AlgorithmConfig:
    gamma: float = 1.0
    """GAE discount."""
    lam: float = 1.0
    """GAE lambda."""
    adv_estimator: str = "gae"
    """gae (PPO with a critic), grpo (group-normalised outcome rewards) or another of verl's outcome
    estimators: rloo, reinforce_plus_plus, reinforce_plus_plus_baseline, opo, gpg, grpo_passk, remax
    (which also generates one greedy response per prompt as its baseline)."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide GRPO advantages by the group's standard deviation."""
    use_kl_in_reward: bool = False
    """Subtract a KL penalty to the reference from the token rewards."""
    kl_penalty: str = "kl"
    """KL estimator of the in-reward penalty."""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)

    def __post_init__(self) -> None:
        _choice(self, "adv_estimator", ADV_ESTIMATORS)
        _choice(self, "kl_penalty", KL_LOSS_TYPES)


@dataclass
class CustomRewardFunctionConfig:
    """verl's reward plug-in: a Python file and the function in it that scores every response."""

    path: str | None = None
    """Python file defining the reward; None uses repro's rule rewards (openai/gsm8k, repro/arith).
    The function has verl's signature ``compute_score(data_source, solution_str, ground_truth,
    extra_info=None, **reward_kwargs) -> float`` and replaces the rule rewards for every data source."""
    name: str = "compute_score"
    """Name of the function in ``path``."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for the function (verl's ``custom_reward_function.reward_kwargs``)."""

    def __post_init__(self) -> None:
        if self.path is not None and not str(self.path).strip():
            _fail(self, "path", "is empty; give a Python file or leave it unset (null)")
        if not self.name or not str(self.name).isidentifier():
            _fail(self, "name", "must be a Python function name")


@dataclass
class RewardConfig:
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    """verl 0.9's place for the reward plug-in (the top-level ``custom_reward_function`` is the legacy one)."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Passed to the reward function: method (strict|flexible), format_score, score."""
    num_workers: int = 1
    """Accepted for verl compatibility; rewards are computed on the driver."""

    def __post_init__(self) -> None:
        for key in self.reward_kwargs:
            if key not in REWARD_KWARGS:
                _fail(
                    self,
                    f"reward_kwargs.{key}",
                    f"is not known; choose from {list(REWARD_KWARGS)}",
                    self.reward_kwargs[key],
                )
        if "method" in self.reward_kwargs:
            _choice(self, "reward_kwargs.method", GSM8K_METHODS, self.reward_kwargs["method"])


@dataclass
class DataConfig:
    train_files: Any = None
    """Parquet file(s) of training prompts; None uses the built-in arithmetic task."""
    val_files: Any = None
    """Parquet file(s) of validation prompts; None uses the built-in arithmetic task."""
    prompt_key: str = "prompt"
    """Column holding the chat-format prompt."""
    reward_fn_key: str = "data_source"
    """Column that picks the reward function."""
    train_batch_size: int = 1024
    """Prompts per RL step."""
    val_batch_size: int | None = None
    """Accepted for verl compatibility; validation runs the whole set."""
    max_prompt_length: int = 512
    """Longest prompt in tokens (left-padded to this length)."""
    max_response_length: int = 512
    """Most tokens generated per response."""
    filter_overlong_prompts: bool = False
    """Drop prompts longer than max_prompt_length instead of failing."""
    truncation: str = "error"
    """error, left or right: what to do with an over-long prompt that is kept."""
    trust_remote_code: bool = False
    """Passed to the tokenizer."""
    shuffle: bool = True
    """Shuffle the training prompts each epoch."""
    seed: int = 1
    """Seed of the prompt order."""
    return_raw_chat: bool = False
    """Accepted for verl compatibility (no effect)."""

    def __post_init__(self) -> None:
        _positive(self, "train_batch_size")
        _positive(self, "max_prompt_length")
        _positive(self, "max_response_length")
        _choice(self, "truncation", ("error", "left", "right", "middle"))


@dataclass
class TrainerConfig:
    project_name: str = "repro"
    """Group name of the run (logs, output directory)."""
    experiment_name: str = "ppo_trainer"
    """Name of the run (each preset sets its own, so that two presets never share run folders)."""
    logger: list[str] = field(default_factory=lambda: ["console"])
    """console and/or file; other verl loggers are accepted and ignored with a warning."""
    n_gpus_per_node: int = 2
    """Ranks per node (CPU processes when there is no GPU)."""
    nnodes: int = 1
    """Nodes; world size = n_gpus_per_node * nnodes."""
    device: str = "auto"
    """auto (cuda if available), cpu or cuda."""
    total_epochs: int = 1
    """Passes over the training prompts when total_training_steps is None."""
    total_training_steps: int | None = None
    """RL steps to run; None runs total_epochs over the data."""
    save_freq: int = -1
    """Checkpoint every N steps (<= 0 disables)."""
    test_freq: int = -1
    """Validate every N steps (<= 0 disables)."""
    val_before_train: bool = False
    """Validate once before the first step."""
    critic_warmup: int = 0
    """Steps that update only the critic."""
    default_local_dir: str | None = None
    """Checkpoint directory; defaults to <output dir>/checkpoints."""
    output_dir: str | None = None
    """Run directory; defaults to outputs/<experiment_name>_<timestamp> (resume reuses the latest)."""
    resume_mode: str = "auto"
    """auto (latest checkpoint if any), disable, or resume_path."""
    resume_from_path: str | None = None
    """Checkpoint directory to resume from with resume_mode=resume_path."""
    allow_config_change: list[str] = field(default_factory=list)
    """Keys (or sections) allowed to differ from the checkpoint's run with resume_mode=resume_path."""
    max_actor_ckpt_to_keep: int | None = 2
    """Actor checkpoints kept on disk (None keeps all)."""
    max_critic_ckpt_to_keep: int | None = 2
    """Critic checkpoints kept on disk (None keeps all)."""
    seed: int = 1
    """Seed of model init, sampling and data order."""
    use_legacy_worker_impl: str = "auto"
    """Accepted for verl compatibility (no effect)."""
    dry_run: bool = False
    """Validate and print the effective plan as JSON without starting workers."""
    ray_address: str | None = None
    """Existing Ray cluster to join; None starts a local one."""
    progress: str = "auto"
    """auto (bar on a terminal), bar or plain."""
    profile_steps: list[int] = field(default_factory=list)
    """Steps to run under torch.profiler on every rank: <run dir>/profile/ gets each rank's top
    operators (CPU and device time) and a Chrome trace per listed step. Costs the step's speed."""

    def __post_init__(self) -> None:
        if any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in self.profile_steps):
            _fail(self, "profile_steps", "must list step numbers >= 1")
        if self.total_training_steps is not None and any(s > self.total_training_steps for s in self.profile_steps):
            _fail(self, "profile_steps", f"lists a step after the last (trainer.total_training_steps="
                  f"{self.total_training_steps})")
        _positive(self, "n_gpus_per_node")
        _positive(self, "nnodes")
        _choice(self, "device", DEVICES)
        _choice(self, "resume_mode", ("auto", "disable", "resume_path"))
        _choice(self, "progress", ("auto", "bar", "plain"))
        if self.allow_config_change and self.resume_mode != "resume_path":
            _fail(self, "allow_config_change", "needs trainer.resume_mode=resume_path and trainer.resume_from_path")
        if self.total_training_steps is not None:
            _positive(self, "total_training_steps")


@dataclass
class RayKwargs:
    ray_init: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for ``ray.init``."""


@dataclass
class RunConfig:
    """The whole run: the root of ``-cn ppo_trainer``."""

    defaults: list[Any] = field(
        default_factory=lambda: [
            {"actor@actor_rollout_ref.actor": "ds_actor"},
            {"critic": "ds_critic"},
            "_self_",
        ]
    )
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    """Legacy (pre-0.9 verl) place of ``reward.custom_reward_function``; set one or the other."""
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ray_kwargs: RayKwargs = field(default_factory=RayKwargs)


def custom_reward(cfg: RunConfig) -> tuple[str, CustomRewardFunctionConfig] | None:
    """(config key, section) of the reward plug-in in use, or None for the rule rewards."""
    new, old = cfg.reward.custom_reward_function, cfg.custom_reward_function
    if new.path and old.path and (new.path, new.name) != (old.path, old.name):
        raise ValueError(
            f"reward.custom_reward_function.path={new.path!r} and the legacy custom_reward_function.path="
            f"{old.path!r} disagree; set only one"
        )
    if new.path:
        return "reward.custom_reward_function", new
    if old.path:
        return "custom_reward_function", old
    return None


def critic_enabled(cfg: RunConfig) -> bool:
    """Whether the run trains a critic: explicit ``critic.enable``, else GAE needs one."""
    if cfg.critic.enable is None:
        return cfg.algorithm.adv_estimator == "gae"
    return bool(cfg.critic.enable)


def ref_policy_used(cfg: RunConfig) -> bool:
    """Whether a frozen reference policy is needed: a KL loss or a KL penalty in the reward."""
    return bool(cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward)


# Keys that verl's command lines set but that mean nothing for this backend. Setting one to a
# non-default value gives one warning each; the reason says why it is ignored.
NO_EFFECT_KEYS: dict[str, str] = {
    "trainer.use_legacy_worker_impl": "repro has a single worker implementation",
    "actor_rollout_ref.rollout.mode": "the hf rollout is synchronous",
    "actor_rollout_ref.rollout.load_format": "vLLM only",
    "actor_rollout_ref.rollout.max_num_seqs": "vLLM only",
    "actor_rollout_ref.rollout.max_num_batched_tokens": "vLLM only",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "vLLM only",
    "actor_rollout_ref.rollout.max_model_len": "vLLM only",
    "actor_rollout_ref.rollout.enforce_eager": "vLLM only",
    "actor_rollout_ref.rollout.free_cache_engine": "vLLM only",
    "actor_rollout_ref.rollout.enable_chunked_prefill": "vLLM only",
    "reward.num_workers": "rewards are computed on the driver",
    "data.return_raw_chat": "prompts are rendered by the driver",
    "data.val_batch_size": "validation runs the whole set in one pass",
}
