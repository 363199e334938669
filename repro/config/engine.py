"""The DeepSpeed-facing sections: optimizer, ``deepspeed`` block, checkpoint contents, and the
DeepSpeed environment knobs (read exactly once, by :func:`resolve_env_knobs`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from repro.config.fields import (
    MODEL_DTYPES,
    OFFLOAD_CHOICES,
    WARMUP_STYLES,
    ZERO_STAGES,
    _choice,
    _fail,
    _positive,
)

ENV_PARAM_OFFLOAD = "VERL_ENABLE_PARAM_OFFLOAD"


ENV_FP32_ACCUM = "VERL_DS_ZERO2_FP32_ACCUM_PATCH"


ENV_STEP_EACH_MICRO = "VERL_DS_ZERO2_STEP_EACH_MICRO"


ENV_KNOBS = {
    ENV_PARAM_OFFLOAD: "param_offload",
    ENV_FP32_ACCUM: "fp32_grad_accum",
    ENV_STEP_EACH_MICRO: "step_each_micro",
}
"""Each DeepSpeed environment knob and the :class:`DeepSpeedConfig` key whose default (None) it is;
docs/config.md's table of environment variables names the same pairs (a unit test holds it)."""


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
    """none, cpu, nvme or auto (= cpu), by the stage-aware rule (``ds_config.resolve_offload``): ZeRO-1/2
    offload the optimizer states, ZeRO-3 also the parameters with ``param_offload``; nvme needs ZeRO-3 and
    ``offload_dir``."""
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
    reduce_bucket_size: int | None = None
    """DeepSpeed reduce bucket size (elements); None: 5e8 (DeepSpeed's), size-aware at ZeRO-3 with ``zero3_size_aware``."""
    stage3_prefetch_bucket_size: int | None = None
    """ZeRO-3 elements fetched ahead; None: DeepSpeed's 5e7, or size-aware with ``zero3_size_aware``."""
    stage3_param_persistence_threshold: int | None = None
    """ZeRO-3: parameters below this many elements stay whole on every rank; None: 1e5, or size-aware."""
    zero3_size_aware: bool = False
    """ZeRO-3: fill the unset sizes above from the model's hidden size (``repro.config.zero3``); False (the
    default, measured in results/bench/zero3_defaults.md: no faster at the Qwen3-0.6B shape): DeepSpeed's."""
    allgather_bucket_size: int = 500_000_000
    """DeepSpeed allgather bucket size (elements, ZeRO-1/2)."""
    overlap_comm: bool | None = None
    """Reduce gradient buckets on DeepSpeed's side stream while the backward goes on; None: DeepSpeed's
    default (off at ZeRO-1/2, on at ZeRO-3). At ZeRO-2 a bucket reduces only once full (``reduce_bucket_size``)."""
    memory_efficient_linear: bool | None = None
    """ZeRO-3: DeepSpeed replaces ``torch.nn.functional.linear`` process-wide with its autograd function that
    keeps no gathered weight for the backward; None: DeepSpeed's default (on). False keeps torch's linear (and
    undoes the replacement): less host work per layer, the gathered weight saved by a forward with gradients."""
    torch_adam: bool | None = None
    """Use DeepSpeed's torch AdamW instead of FusedAdam/CPUAdam; None: torch on CPU, fused on CUDA."""
    zero3_leaf_modules: bool = True
    """ZeRO-3: fetch each decoder layer as one unit (``repro.workers.zero3_leaf``); False: stock hooks."""
    zero3_coalesce_persistent_gather: bool = True
    """ZeRO-3: after each optimizer step, gather the parameters kept whole (``stage3_param_persistence_threshold``)
    in one coalesced all-gather (``repro.workers.zero3_persist_gather``); False: DeepSpeed's, one per parameter."""
    zero3_unhook_persistent_modules: bool = True
    """ZeRO-3: take DeepSpeed's fetch/release hooks off every module whose parameters all stay whole (or that has
    none), which have nothing to fetch (``repro.workers.zero3_persist_hooks``); False: DeepSpeed's hooks on all."""
    fused_overflow_check: bool = True
    """ZeRO-1/2: test the gradients for inf / NaN before each step in one multi-tensor reduction
    (``repro.workers.overflow_check``); False: DeepSpeed's loop, about a dozen operators per gradient tensor."""

    def __post_init__(self) -> None:
        _choice(self, "zero_stage", ZERO_STAGES)
        _choice(self, "offload", OFFLOAD_CHOICES)
        _choice(self, "model_dtype", MODEL_DTYPES)
        # DeepSpeed's own bounds: a reduce bucket > 0; prefetch 0 turns prefetching off.
        for name, low in (("reduce_bucket_size", 1), ("stage3_prefetch_bucket_size", 0),
                          ("stage3_param_persistence_threshold", 0)):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                _fail(self, name, f"must be an integer >= {low} (or null: size-aware)")
        if self.memory_efficient_linear is not None and self.zero_stage != 3:
            _fail(self, "memory_efficient_linear", f"is a ZeRO-3 key; zero_stage is {self.zero_stage} (leave it null)")


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
    for env, key in ENV_KNOBS.items():
        if getattr(ds, key) is None:
            setattr(ds, key, bool(_env_flag(environ, env)))
    return ds
