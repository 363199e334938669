"""The model-holding roles' sections: model, actor (and its policy loss), reference, rollout, critic."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from repro.config.engine import CheckpointConfig, DeepSpeedConfig, OptimConfig
from repro.config.fields import (
    COMPILE_LAYERS,
    COMPILE_SCOPES,
    FLASH_ATTENTION,
    GRADIENT_CHECKPOINTING,
    KL_LOSS_TYPES,
    POLICY_LOSS_MODES,
    ROLLOUT_NAMES,
    _check_trainer_role,
    _choice,
    _fail,
    _positive,
)


@dataclass
class LayerKernels:
    """How the decoder layers run: compiled or not, and whose FlashAttention kernels. A model section's keys in repro's
    trainer (``actor_rollout_ref.model``, ``critic.model``) and an engine section's in verl's
    (``actor_rollout_ref.actor.deepspeed``...: ``repro.integrations.verl.engine_keys``), defined and validated here."""

    compile_layers: str = "off"
    """``off``, or the ``torch.compile`` backend of every decoder layer (``inductor``; ``aot_eager``: traced, run by
    torch's kernels, bitwise the eager arithmetic). ZeRO-1/2 only. On one H100 at the 0.6B shape without checkpointing
    it made the update 1.18x faster (``results/actor_update/README.md``, session 16); under checkpointing it did not
    measurably pay."""
    compile_scope: str = "layer"
    """What one compiled region holds where ``compile_layers`` is on: ``layer`` (each decoder layer its own) or
    ``stack`` (the model's whole decoder stack: embeddings, every layer, the final norm). On one H100 at four
    micro-batches the compiled layers cost the host 0.63 ms a layer call forward and 0.82 backward, mostly the wrappers
    around the generated code, not its kernel launches (``results/actor_update/README.md``, session 34); one region
    pays those once a micro-batch instead of once a layer. Not yet timed on a GPU."""
    flash_attention: str = "torch"
    """The FlashAttention kernels of remove-padding's packed attention on CUDA in half precision: ``torch`` (its bundled
    FlashAttention-2) or ``fa4`` (FlashAttention-4 on Hopper/Blackwell, the ``gpu`` extra, with repro's glue:
    ``repro.workers.fa4_kernels``), process-wide through torch's flash attention registry
    (``repro.workers.varlen.activate``); the engine report's ``flash_attention`` reads back which ran.
    CPU runs and fp32 attend without them."""

    def __post_init__(self) -> None:
        _choice(self, "compile_layers", COMPILE_LAYERS)
        _choice(self, "compile_scope", COMPILE_SCOPES)
        _choice(self, "flash_attention", FLASH_ATTENTION)


@dataclass
class ModelConfig(LayerKernels):
    """A role's model section (``actor_rollout_ref.model``, ``critic.model``), its layer keys :class:`LayerKernels`'."""

    path: str = "tiny"
    """Hugging Face model directory, or ``tiny`` for the built-in tiny Qwen3 arithmetic policy."""
    tokenizer_path: str | None = None
    """Tokenizer directory; defaults to ``path``."""
    enable_gradient_checkpointing: bool | str = False
    """Activation checkpointing in the transformer blocks: ``true``, ``false``, or ``auto``: on only where the largest
    micro-batch's activations would not fit in the device's free memory, measured at the role's first update
    (:mod:`repro.workers.activation_checkpointing`; the engine report's ``gradient_checkpointing`` says which)."""
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
        super().__post_init__()
        _choice(self, "enable_gradient_checkpointing", GRADIENT_CHECKPOINTING)
        if self.lora_rank < 0:
            _fail(self, "lora_rank", "must be >= 0 (0 disables LoRA)")
        if self.lora_rank and self.lora_alpha <= 0:
            _fail(self, "lora_alpha", "must be > 0")


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
    """Pack micro-batches by token budget (ppo_max_token_len_per_gpu) instead of sample count. The
    faster choice on variable-length RL batches (3.0-3.4x the padded update of micro-batch 4 at the
    Qwen3-0.6B shape, default budget, about the same memory: results/peers/README.md); off by
    default as in verl, whose command lines size micro-batches in samples."""
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
    loss_scale_factor: float | None = None
    """seq-mean-token-sum-norm's constant divisor (Dr. GRPO); None: the padded response width."""
    entropy_coeff: float = 0.0
    """Entropy bonus weight."""
    use_kl_loss: bool = False
    """Add a KL-to-reference term to the actor loss (GRPO style)."""
    kl_loss_coef: float = 0.001
    """Weight of the KL loss."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator of the KL loss."""
    ulysses_sequence_parallel_size: int = 1
    """Ulysses sequence-parallel group size (repro.workers.ulysses): an integer >= 1 that divides the world
    size; roles with sp > 1 share one size."""
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
    calculate_log_probs: bool = False
    """hf rollout: also return each sampled token's log-prob (``rollout_log_probs``, from the processed
    scores), so the trainer logs ``rollout_corr/*``; off by default because it keeps a [batch, vocab]
    score tensor per decoded token. The vLLM rollout always returns them (they come free there)."""
    micro_batch_size_per_gpu: int | None = None
    """Prompts per hf generate call on each rank; None generates the whole shard at once.

    The hf decode is launch-bound (about the same time per token at batch 64 and 128 on an
    H100), so each split of the shard pays the per-token cost again; set it only to bound memory."""
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
    """vLLM only: sleep mode, the engine frees its GPU memory while the actor trains."""
    enable_chunked_prefill: bool = True
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
    loss_scale_factor: float | None = None
    """seq-mean-token-sum-norm's constant divisor (Dr. GRPO); None: the padded response width."""
    grad_clip: float = 1.0
    """Gradient-norm clip (0 disables)."""
    ulysses_sequence_parallel_size: int = 1
    """Ulysses sequence-parallel group size (repro.workers.ulysses): an integer >= 1 that divides the world
    size; roles with sp > 1 share one size."""
    data_loader_seed: int | None = None
    """Seed of the shuffle between epochs; defaults to data.seed."""
    deepspeed_config: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def __post_init__(self) -> None:
        _check_trainer_role(self)
