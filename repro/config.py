"""Structured run configuration with verl's key names, registered with Hydra's ConfigStore.

The tree mirrors verl's ``ppo_trainer`` config so that the command lines of verl's DeepSpeed PR
work here with ``verl`` replaced by ``repro``. Each dataclass validates itself in
``__post_init__``; cross-section rules (batch splits, critic on/off) live in
:func:`validate_run_config`. The DeepSpeed environment knobs are read exactly once, by
:func:`resolve_env_knobs`, and stored in the config so the effective plan shows them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

ZERO_STAGES = (1, 2, 3)
OFFLOAD_CHOICES = ("none", "cpu", "nvme", "auto")
MODEL_DTYPES = ("auto", "bfloat16", "float32")
# The valid names of each algorithm choice live here, at the bottom of the import order, and the
# modules that implement them (repro.algorithms, advantages, policy_losses) import them.
ADV_ESTIMATORS = ("gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo", "gpg",
                  "grpo_passk")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "token-sum", "seq-mean-token-sum-norm")
_KL_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
# "<kind>+": the value of <kind>, the gradient of k2 (straight-through; verl's unbiased KL gradient).
KL_LOSS_TYPES = _KL_KINDS + tuple(k + "+" for k in _KL_KINDS)
WARMUP_STYLES = ("constant", "cosine", "linear")
ROLLOUT_NAMES = ("hf", "vllm")
REWARD_KWARGS = ("method", "format_score", "score")
GSM8K_METHODS = ("strict", "flexible")
DEVICES = ("auto", "cpu", "cuda")

ENV_PARAM_OFFLOAD = "VERL_ENABLE_PARAM_OFFLOAD"
ENV_FP32_ACCUM = "VERL_DS_ZERO2_FP32_ACCUM_PATCH"
ENV_STEP_EACH_MICRO = "VERL_DS_ZERO2_STEP_EACH_MICRO"


class ConfigFieldError(ValueError):
    """A bad value in one config section, named relative to that section.

    Sections are reused (``DeepSpeedConfig`` sits under the actor, the critic and the reference
    policy), so ``__post_init__`` cannot know its full key; ``repro.config_loader`` finds the
    section's path and re-raises with the full key (``actor_rollout_ref.actor.deepspeed.zero_stage``).
    Raised directly, the message names the class instead (``DeepSpeedConfig.zero_stage``).
    """

    def __init__(self, section: str, field_name: str, value: Any, detail: str) -> None:
        self.section = section
        self.field_name = field_name
        self.value = value
        self.detail = detail
        super().__init__(self.at(section))

    def at(self, path: str) -> str:
        """The message with the section's full path in front of the field name."""
        return f"{path}.{self.field_name}={self.value!r} {self.detail}"


def _fail(obj: Any, name: str, detail: str, value: Any = None) -> None:
    value = getattr(obj, name) if value is None and "." not in name else value
    raise ConfigFieldError(type(obj).__name__, name, value, detail)


def _choice(obj: Any, name: str, choices: tuple, value: Any = None) -> None:
    value = getattr(obj, name) if value is None else value
    if value not in choices:
        _fail(obj, name, f"is not valid; choose one of {list(choices)}", value)


def _positive(obj: Any, name: str, allow_none: bool = False) -> None:
    value = getattr(obj, name)
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        _fail(obj, name, "must be a positive number", value)



def _check_trainer_role(role: Any) -> None:
    """The checks the actor and the critic share: backend, batch sizes, loss reduction."""
    if role.strategy != "deepspeed":
        _fail(role, "strategy", "is not supported here; choose one of ['deepspeed']")
    _positive(role, "ppo_mini_batch_size")
    _positive(role, "ppo_micro_batch_size_per_gpu", allow_none=True)
    _positive(role, "ppo_micro_batch_size", allow_none=True)
    _positive(role, "ppo_max_token_len_per_gpu")
    _positive(role, "ppo_epochs")
    _choice(role, "loss_agg_mode", LOSS_AGG_MODES)

@dataclass
class OptimConfig:
    lr: float = 1e-6
    """Peak learning rate."""
    lr_warmup_steps: int = -1
    """Warm-up optimizer steps; -1 derives them from ``lr_warmup_steps_ratio``."""
    lr_warmup_steps_ratio: float = 0.0
    """Fraction of the total optimizer steps spent warming up when ``lr_warmup_steps`` is -1."""
    warmup_style: str = "constant"
    """Schedule after warm-up: constant, linear decay or cosine decay to ``min_lr_ratio * lr``."""
    min_lr_ratio: float = 0.0
    """Floor of the decaying schedules, as a fraction of ``lr``."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    total_training_steps: int = -1
    """Optimizer steps of the whole run (one per mini-batch). Left at -1, ``load_config`` fills it from
    trainer.total_training_steps x ppo_epochs x mini-batches per step; without that the trainer does."""

    def __post_init__(self) -> None:
        _positive(self, "lr")
        _choice(self, "warmup_style", WARMUP_STYLES)
        if not 0.0 <= self.lr_warmup_steps_ratio <= 1.0:
            _fail(self, "lr_warmup_steps_ratio", "must be in [0, 1]")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            _fail(self, "min_lr_ratio", "must be in [0, 1]")
        if len(self.betas) != 2:
            _fail(self, "betas", "must have two values", list(self.betas))


@dataclass
class DeepSpeedConfig:
    """The DeepSpeed section of one role (``actor.deepspeed`` / ``critic.deepspeed_config``)."""

    zero_stage: int = 2
    """ZeRO stage: 1 (optimizer states), 2 (+ gradients), 3 (+ parameters)."""
    offload: str = "none"
    """none, cpu or nvme; applied per stage by ``ds_config.resolve_offload`` (auto means cpu)."""
    offload_dir: str | None = None
    """Directory for NVMe offload swap files (required with ``offload=nvme``)."""
    model_dtype: str = "auto"
    """Training dtype: bfloat16, float32, or auto (bf16 on CUDA, fp32 on CPU)."""
    param_offload: bool | None = None
    """ZeRO-3 parameter offload with ``offload=cpu``; None reads VERL_ENABLE_PARAM_OFFLOAD."""
    fp32_grad_accum: bool | None = None
    """Accumulate gradients in fp32 (DeepSpeed ``data_types.grad_accum_dtype``); None reads VERL_DS_ZERO2_FP32_ACCUM_PATCH."""
    step_each_micro: bool | None = None
    """Call ``engine.step()`` after every micro-batch; None reads VERL_DS_ZERO2_STEP_EACH_MICRO."""
    reduce_bucket_size: int = 500_000_000
    """DeepSpeed reduce bucket size (elements)."""
    allgather_bucket_size: int = 500_000_000
    """DeepSpeed allgather bucket size (elements, ZeRO-1/2)."""
    torch_adam: bool | None = None
    """Use DeepSpeed's torch AdamW instead of FusedAdam/CPUAdam; None: torch on CPU, fused on CUDA."""
    zero3_leaf_modules: bool = True
    """ZeRO-3: fetch each decoder layer as one unit (``repro.workers.zero3_leaf``); False: stock hooks."""

    def __post_init__(self) -> None:
        _choice(self, "zero_stage", ZERO_STAGES)
        _choice(self, "offload", OFFLOAD_CHOICES)
        _choice(self, "model_dtype", MODEL_DTYPES)


CHECKPOINT_REQUIRED = ("model", "optimizer", "extra")
CHECKPOINT_SAVE_CONTENTS = CHECKPOINT_REQUIRED + ("hf_model",)
CHECKPOINT_LOAD_CONTENTS = CHECKPOINT_REQUIRED


@dataclass
class CheckpointConfig:
    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    """What a checkpoint holds (DeepSpeed saves model and optimizer together)."""
    load_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    """What a resume loads."""

    def __post_init__(self) -> None:
        # DeepSpeed writes and reads model, optimizer (LR scheduler inside) and our extra (RNG,
        # data position) as one exact-resume unit; a partial save or load would resume wrongly.
        for name, valid in (("save_contents", CHECKPOINT_SAVE_CONTENTS), ("load_contents", CHECKPOINT_LOAD_CONTENTS)):
            value = list(getattr(self, name))
            for key in value:
                _choice(self, name, valid, key)
            missing = [k for k in CHECKPOINT_REQUIRED if k not in value]
            if missing:
                _fail(self, name, f"must include {missing}: DeepSpeed saves and loads model, optimizer and the "
                      f"resume state together here; valid values: {list(valid)}", value)


@dataclass
class ModelConfig:
    path: str = "tiny"
    """Hugging Face model directory, or ``tiny`` for the built-in tiny Qwen3 arithmetic policy."""
    tokenizer_path: str | None = None
    """Tokenizer directory; defaults to ``path``."""
    enable_gradient_checkpointing: bool = False
    """Activation checkpointing in the transformer blocks."""
    use_remove_padding: bool = False
    """Forward on each micro-batch's real tokens packed into rows (position_ids only; repro.workers.packing)."""
    trust_remote_code: bool = False
    """Passed to ``from_pretrained``."""
    external_lib: str | None = None
    """Module imported before the model is built (custom architectures)."""
    override_config: dict[str, Any] = field(default_factory=dict)
    """Keys set on the Hugging Face model config (e.g. ``attn_implementation``)."""
    lora_rank: int = 0
    """LoRA rank (0: full fine-tuning); the actor trains peft adapters only (repro.workers.lora)."""
    lora_alpha: int = 16
    """LoRA scaling numerator (adapter update scaled by lora_alpha / lora_rank)."""
    target_modules: Any = "all-linear"
    """Modules that get adapters: ``all-linear`` or a list of module names (peft's target_modules)."""
    exclude_modules: Any = None
    """Modules never adapted (peft's exclude_modules), or None."""

    def __post_init__(self) -> None:
        if self.lora_rank < 0:
            _fail(self, "lora_rank", "must be >= 0 (0 disables LoRA)")
        if self.lora_rank and self.lora_alpha <= 0:
            _fail(self, "lora_alpha", "must be > 0")


POLICY_LOSS_MODES = ("vanilla", "gspo", "gpg", "cispo", "geo_mean", "clip_cov", "kl_cov")


@dataclass
class PolicyLossConfig:
    loss_mode: str = "vanilla"
    """vanilla (PPO clip + dual clip), gspo, gpg, cispo, geo_mean, clip_cov or kl_cov (verl's names)."""
    clip_cov_ratio: float = 0.0002
    """clip_cov: share of tokens whose gradient is dropped."""
    clip_cov_lb: float = 1.0
    """clip_cov: lower covariance bound of the candidates."""
    clip_cov_ub: float = 5.0
    """clip_cov: upper covariance bound of the candidates."""
    kl_cov_ratio: float = 0.0002
    """kl_cov: share of tokens that get the |log-ratio| penalty."""
    ppo_kl_coef: float = 0.1
    """kl_cov: weight of that penalty."""

    def __post_init__(self) -> None:
        _choice(self, "loss_mode", POLICY_LOSS_MODES)
        for name in ("clip_cov_ratio", "kl_cov_ratio"):
            if not 0 < getattr(self, name) <= 1:
                _fail(self, name, "must be in (0, 1]")


@dataclass
class ActorConfig:
    strategy: str = "deepspeed"
    """Training backend; only ``deepspeed`` is implemented here."""
    ppo_mini_batch_size: int = 256
    """Prompts per mini-batch (multiplied by rollout.n into samples)."""
    ppo_micro_batch_size_per_gpu: int | None = 8
    """Samples per micro-batch on each rank (ignored with use_dynamic_bsz); must divide the per-rank mini-batch."""
    ppo_micro_batch_size: int | None = None
    """Deprecated global micro-batch size, divided by dp; setting it on the command line replaces the per-gpu default."""
    use_dynamic_bsz: bool = False
    """Pack micro-batches by token budget (ppo_max_token_len_per_gpu) instead of sample count."""
    ppo_max_token_len_per_gpu: int = 16384
    """Token budget of one dynamic micro-batch."""
    ppo_epochs: int = 1
    """Passes over each step's batch."""
    shuffle: bool = False
    """Shuffle samples between epochs."""
    clip_ratio: float = 0.2
    """PPO clip epsilon (both sides unless clip_ratio_low/high are set)."""
    clip_ratio_low: float | None = None
    """Lower clip epsilon; defaults to clip_ratio."""
    clip_ratio_high: float | None = None
    """Upper clip epsilon; defaults to clip_ratio."""
    clip_ratio_c: float = 3.0
    """Dual-clip constant for negative advantages (must be > 1)."""
    loss_agg_mode: str = "token-mean"
    """How token losses reduce to the batch loss."""
    entropy_coeff: float = 0.0
    """Entropy bonus weight."""
    use_kl_loss: bool = False
    """Add a KL-to-reference term to the actor loss (GRPO style)."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator of the KL loss."""
    ulysses_sequence_parallel_size: int = 1
    """Sequence-parallel degree; only 1 is implemented for DeepSpeed workers."""
    grad_clip: float = 1.0
    """Gradient-norm clip (0 disables)."""
    data_loader_seed: int | None = None
    """Seed of the shuffle between epochs; defaults to data.seed."""
    skip_inactive_micro_batches: bool = False
    """Skip backward for micro-batches with no response tokens; allowed only at world size 1."""
    unsafe_allow_skip_in_data_parallel: bool = False
    """Allow the skip above in multi-rank data parallel (reproduces the historical ZeRO-2 hang)."""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def __post_init__(self) -> None:
        _check_trainer_role(self)
        _choice(self, "kl_loss_type", KL_LOSS_TYPES)
        if self.clip_ratio_c <= 1.0:
            _fail(self, "clip_ratio_c", "must be > 1 (dual clip)")
        if self.ulysses_sequence_parallel_size < 1:
            _fail(self, "ulysses_sequence_parallel_size", "must be >= 1")


@dataclass
class RefConfig:
    log_prob_micro_batch_size_per_gpu: int | None = None
    """Samples per forward micro-batch of the reference policy; defaults to rollout's."""
    log_prob_max_token_len_per_gpu: int = 16384
    """Token budget of one dynamic log-prob micro-batch."""
    log_prob_use_dynamic_bsz: bool = False
    """Pack log-prob micro-batches by tokens."""
    deepspeed: DeepSpeedConfig = field(default_factory=lambda: DeepSpeedConfig(zero_stage=3))


@dataclass
class ValKwargs:
    temperature: float = 0.0
    """Validation sampling temperature (0 = greedy)."""
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1
    do_sample: bool = False


@dataclass
class RolloutConfig:
    name: str = "hf"
    """hf (transformers generate on a synced copy) or vllm (optional extra)."""
    mode: str = "sync"
    """sync or async; the hf rollout is synchronous (async accepted for verl compatibility)."""
    n: int = 1
    """Samples per prompt (GRPO group size)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    """-1 disables top-k."""
    do_sample: bool = True
    prompt_length: int | None = None
    """Defaults to data.max_prompt_length."""
    response_length: int | None = None
    """Defaults to data.max_response_length."""
    log_prob_micro_batch_size_per_gpu: int | None = None
    """Samples per forward micro-batch when computing old log-probs."""
    log_prob_max_token_len_per_gpu: int = 16384
    log_prob_use_dynamic_bsz: bool = False
    micro_batch_size_per_gpu: int | None = None
    """Prompts per generate call on each rank; None generates the whole shard at once."""
    tensor_model_parallel_size: int = 1
    """vLLM tensor parallelism (must be 1 for the hf rollout)."""
    max_model_len: int | None = None
    """vLLM only."""
    max_num_seqs: int = 1024
    """vLLM only."""
    max_num_batched_tokens: int = 8192
    """vLLM only."""
    gpu_memory_utilization: float = 0.5
    """vLLM only."""
    load_format: str = "auto"
    """vLLM only."""
    enforce_eager: bool = True
    """vLLM only."""
    free_cache_engine: bool = True
    """vLLM only."""
    val_kwargs: ValKwargs = field(default_factory=ValKwargs)

    def __post_init__(self) -> None:
        _choice(self, "name", ROLLOUT_NAMES)
        _choice(self, "mode", ("sync", "async"))
        _positive(self, "n")
        if self.temperature < 0:
            _fail(self, "temperature", "must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            _fail(self, "top_p", "must be in (0, 1]")


@dataclass
class ActorRolloutRefConfig:
    hybrid_engine: bool = True
    """Actor and rollout share devices (the only layout here)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)


@dataclass
class CriticConfig:
    enable: bool | None = None
    """Train a critic; None decides from algorithm.adv_estimator (gae needs one, grpo does not)."""
    strategy: str = "deepspeed"
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    model: ModelConfig = field(default_factory=ModelConfig)
    ppo_mini_batch_size: int = 256
    """Prompts per critic mini-batch (times rollout.n)."""
    ppo_micro_batch_size_per_gpu: int | None = 8
    """Samples per critic micro-batch on each rank (ignored with use_dynamic_bsz)."""
    ppo_micro_batch_size: int | None = None
    """Deprecated global micro-batch size, divided by dp (see the actor's)."""
    use_dynamic_bsz: bool = False
    """Pack critic micro-batches by token budget (ppo_max_token_len_per_gpu)."""
    ppo_max_token_len_per_gpu: int = 32768
    """Token budget of one dynamic critic micro-batch."""
    forward_micro_batch_size_per_gpu: int | None = None
    """Samples per forward micro-batch of compute_values; defaults to ppo_micro_batch_size_per_gpu."""
    forward_max_token_len_per_gpu: int = 32768
    """Token budget of one dynamic compute_values micro-batch."""
    ppo_epochs: int = 1
    """Passes over each step's batch."""
    shuffle: bool = False
    """Shuffle samples between epochs."""
    cliprange_value: float = 0.5
    """Clip range of the value loss."""
    loss_agg_mode: str = "token-mean"
    """How token losses reduce to the batch loss."""
    grad_clip: float = 1.0
    """Gradient-norm clip (0 disables)."""
    ulysses_sequence_parallel_size: int = 1
    """Sequence-parallel degree; only 1 is implemented for DeepSpeed workers."""
    data_loader_seed: int | None = None
    """Seed of the shuffle between epochs; defaults to data.seed."""
    deepspeed_config: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def __post_init__(self) -> None:
        _check_trainer_role(self)
        if self.ulysses_sequence_parallel_size < 1:
            _fail(self, "ulysses_sequence_parallel_size", "must be >= 1")


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
    estimators: rloo, reinforce_plus_plus, reinforce_plus_plus_baseline, opo, gpg, grpo_passk."""
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
class RewardConfig:
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

    def __post_init__(self) -> None:
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
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ray_kwargs: RayKwargs = field(default_factory=RayKwargs)


def _env_flag(environ: dict[str, str], name: str) -> bool | None:
    raw = environ.get(name)
    if raw is None or raw == "":
        return None
    if raw not in ("0", "1"):
        raise ValueError(f"environment variable {name}={raw!r} must be 0 or 1")
    return raw == "1"


def resolve_env_knobs(ds: DeepSpeedConfig, environ: dict[str, str] | None = None) -> DeepSpeedConfig:
    """Fill the knobs left at None from the DeepSpeed environment variables (read once, here)."""
    environ = dict(os.environ) if environ is None else environ
    if ds.param_offload is None:
        ds.param_offload = bool(_env_flag(environ, ENV_PARAM_OFFLOAD))
    if ds.fp32_grad_accum is None:
        ds.fp32_grad_accum = bool(_env_flag(environ, ENV_FP32_ACCUM))
    if ds.step_each_micro is None:
        ds.step_each_micro = bool(_env_flag(environ, ENV_STEP_EACH_MICRO))
    return ds


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
    "reward.num_workers": "rewards are computed on the driver",
    "data.return_raw_chat": "prompts are rendered by the driver",
    "data.val_batch_size": "validation runs the whole set in one pass",
}
