"""Worker config -> DeepSpeed JSON: the only place a DeepSpeed config dict is made.

Both trainable roles (actor, critic) go through :func:`build_ds_config`, so the stage-aware
offload rule (:func:`resolve_offload`), the dtype choice, the optimizer choice and the LR
schedule are decided once, identically, for every role. Everything here is pure (no torch
device probing, no environment reads): the caller says whether it runs on CUDA and the config
already carries the environment knobs (``repro.config.resolve_env_knobs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from repro.config.fields import revalidate
from repro.config.zero3 import DEEPSPEED_REDUCE_BUCKET_SIZE, SIZE_KEYS, ModelSize, Zero3Size, zero3_sizes

if TYPE_CHECKING:
    from repro.batching.plan import RoleBatchPlan
    from repro.config import DeepSpeedConfig, OptimConfig

# DeepSpeed prints a progress line every ``steps_per_print`` steps; the workers log their own.
_STEPS_PER_PRINT = 10**9


@dataclass(frozen=True)
class OffloadPlan:
    """Where optimizer states and parameters live, after the stage-aware rule."""

    optimizer: str
    """none, cpu or nvme."""
    param: str
    """none, cpu or nvme (only ever set at ZeRO-3)."""
    nvme_path: str | None
    """Swap directory when anything goes to NVMe."""
    note: str | None
    """Why the plan differs from what was asked, if it does."""


def resolve_offload(zero_stage: int, offload: str, param_offload: bool, offload_dir: str | None,
                    key: str = "deepspeed") -> OffloadPlan:
    """The stage-aware offload rule shared by actor and critic.

    ``auto`` means ``cpu``. ZeRO-1 and ZeRO-2 offload the optimizer; ZeRO-3 offloads the optimizer
    and, with ``param_offload``, the parameters. ZeRO-1 differs from verl's seed, which turned
    ZeRO-1 + cpu into no offload: DeepSpeed 0.19.8 builds one optimizer class for stages 1 and 2
    (``DeepSpeedZeroOptimizer``), which offloads whenever ``offload_optimizer`` is set, and the
    engine really holds its fp32 master partitions on the CPU then (read back in
    ``tests/distributed/workers/test_placement.py``).
    ``nvme`` is ZeRO-Infinity: it needs ZeRO-3 and ``deepspeed.offload_dir``, else it is refused
    (it is never turned into CPU offload behind the user's back). ``key`` is the config section
    that errors name (e.g. ``critic.deepspeed_config``). ``zero_stage`` and ``offload`` are a
    :class:`~repro.config.DeepSpeedConfig`'s, already valid (its ``__post_init__`` checks them).
    """
    device = "cpu" if offload == "auto" else offload
    if device == "none":
        return OffloadPlan("none", "none", None, None)
    if device == "nvme":
        if zero_stage != 3:
            raise ValueError(
                f"{key}.offload=nvme needs {key}.zero_stage=3 (ZeRO-Infinity), got zero_stage={zero_stage}; "
                f"use {key}.offload=cpu at ZeRO-1/2"
            )
        if not offload_dir:
            raise ValueError(f"{key}.offload=nvme needs {key}.offload_dir (a directory on an NVMe drive)")
        return OffloadPlan("nvme", "nvme" if param_offload else "none", str(offload_dir), None)
    if zero_stage < 3:
        note = (f"VERL_ENABLE_PARAM_OFFLOAD applies to ZeRO-3 only; ZeRO-{zero_stage} offloads the optimizer"
                if param_offload else None)
        return OffloadPlan("cpu", "none", None, note)
    return OffloadPlan("cpu", "cpu" if param_offload else "none", None, None)


def resolve_model_dtype(model_dtype: str, on_cuda: bool) -> str:
    """``bfloat16`` or ``float32``; ``auto`` is bf16 on CUDA and fp32 on CPU (``model_dtype`` is a valid one)."""
    if model_dtype == "auto":
        return "bfloat16" if on_cuda else "float32"
    return model_dtype


def resolve_warmup_steps(optim: OptimConfig) -> int:
    """Warm-up optimizer steps: ``lr_warmup_steps`` if >= 0, else ratio * total_training_steps."""
    if optim.lr_warmup_steps >= 0:
        return int(optim.lr_warmup_steps)
    if optim.lr_warmup_steps_ratio == 0.0:
        return 0
    if optim.total_training_steps <= 0:
        raise ValueError(
            f"optim.lr_warmup_steps_ratio={optim.lr_warmup_steps_ratio} needs optim.total_training_steps > 0 "
            f"(got {optim.total_training_steps}); or set optim.lr_warmup_steps"
        )
    return int(optim.lr_warmup_steps_ratio * optim.total_training_steps)


def build_scheduler(optim: OptimConfig) -> dict[str, Any] | None:
    """DeepSpeed ``scheduler`` section, or None for a constant LR without warm-up.

    DeepSpeed's warm-up schedulers need at least one warm-up step (they use at least two). For
    ``constant`` without warm-up no scheduler is made; ``cosine`` without warm-up gets a flat
    warm-up (start ratio 1.0); ``linear`` (WarmupDecayLR) warms up from and decays to the same
    floor, ``min_lr_ratio * lr``, so without warm-up it still rises over DeepSpeed's 2-step
    minimum. DeepSpeed applies the scheduler's start value to the first optimizer step.
    """
    revalidate(optim)
    warmup = resolve_warmup_steps(optim)
    if optim.warmup_style == "constant":
        if warmup == 0:
            return None
        params: dict[str, Any] = {"warmup_min_lr": 0.0, "warmup_max_lr": optim.lr, "warmup_num_steps": warmup}
        return {"type": "WarmupLR", "params": {**params, "warmup_type": "linear"}}
    if optim.total_training_steps <= 0:
        raise ValueError(
            f"optim.warmup_style={optim.warmup_style!r} decays over optim.total_training_steps, which must be > 0 "
            f"(got {optim.total_training_steps})"
        )
    total = int(optim.total_training_steps)
    if optim.warmup_style == "linear":
        floor = optim.min_lr_ratio * optim.lr
        params = {
            "total_num_steps": total,
            "warmup_min_lr": floor,
            "warmup_max_lr": optim.lr,
            "warmup_num_steps": max(warmup, 1),
            "warmup_type": "linear",
        }
        return {"type": "WarmupDecayLR", "params": params}
    params = {
        "total_num_steps": total,
        "warmup_min_ratio": 0.0 if warmup else 1.0,
        "warmup_num_steps": max(warmup, 1),
        "cos_min_ratio": optim.min_lr_ratio,
        "warmup_type": "linear",
    }
    return {"type": "WarmupCosineLR", "params": params}


def role_zero3_sizes(ds: DeepSpeedConfig, model_size: ModelSize | None) -> dict[str, Zero3Size] | None:
    """The ZeRO-3 bucket, prefetch and persistence sizes of a role, with their reasons (None below ZeRO-3)."""
    if ds.zero_stage != 3:
        return None
    return zero3_sizes({key: getattr(ds, key) for key in SIZE_KEYS}, model_size, ds.zero3_size_aware)


def build_ds_config(
    ds: DeepSpeedConfig,
    optim: OptimConfig,
    plan: RoleBatchPlan,
    *,
    grad_clip: float,
    on_cuda: bool,
    trainable: bool = True,
    model_size: ModelSize | None = None,
) -> dict[str, Any]:
    """The DeepSpeed JSON of one role.

    ``trainable=False`` (the frozen reference policy) leaves out optimizer, scheduler and
    optimizer offload; ZeRO-3 then only shards (and optionally offloads) the parameters.
    ``model_size`` sizes ZeRO-3's buckets (:func:`role_zero3_sizes`); without it they are DeepSpeed's.
    """
    revalidate(ds)
    revalidate(optim)
    dtype = resolve_model_dtype(ds.model_dtype, on_cuda)
    offload = resolve_offload(ds.zero_stage, ds.offload, bool(ds.param_offload), ds.offload_dir)
    zero: dict[str, Any] = {
        "stage": ds.zero_stage,
        "reduce_bucket_size": int(ds.reduce_bucket_size or DEEPSPEED_REDUCE_BUCKET_SIZE),
        "contiguous_gradients": True,
    }
    sizes = role_zero3_sizes(ds, model_size)
    if sizes is not None:
        zero.update({key: size.value for key, size in sizes.items()})
    if ds.zero_stage < 3:
        zero["allgather_bucket_size"] = int(ds.allgather_bucket_size)
    if ds.overlap_comm is not None:
        zero["overlap_comm"] = bool(ds.overlap_comm)
    if ds.memory_efficient_linear is not None:
        zero["memory_efficient_linear"] = bool(ds.memory_efficient_linear)
    pin = bool(on_cuda)
    if trainable and offload.optimizer != "none":
        section: dict[str, Any] = {"device": offload.optimizer, "pin_memory": pin}
        if offload.optimizer == "nvme":
            section["nvme_path"] = offload.nvme_path
        zero["offload_optimizer"] = section
    if offload.param != "none":
        section = {"device": offload.param, "pin_memory": pin}
        if offload.param == "nvme":
            section["nvme_path"] = offload.nvme_path
        zero["offload_param"] = section

    config: dict[str, Any] = {
        "train_batch_size": int(plan.train_batch_size),
        "train_micro_batch_size_per_gpu": int(plan.micro),
        "gradient_accumulation_steps": int(plan.gas),
        "zero_optimization": zero,
        "bf16": {"enabled": dtype == "bfloat16"},
        "fp16": {"enabled": False},
        "gradient_clipping": float(grad_clip) if grad_clip and grad_clip > 0 else 0.0,
        "steps_per_print": _STEPS_PER_PRINT,
        "wall_clock_breakdown": False,
        # DeepSpeed's throughput timer synchronizes the device at the start of every forward from the third step on
        # (and at every step's end) to time it; repro reads none of its figures, and on a GPU the wait let the device
        # drain before each micro-batch (results/actor_update/README.md, session 34).
        "timers": {"throughput": {"enabled": False}},
    }
    if plan.sp > 1:
        # Ulysses SP: given the SP mpu (repro.workers.ulysses), DeepSpeed's batch check counts
        # data-parallel ranks only (world / sp), so its train_batch_size leaves sp out.
        config["train_batch_size"] = int(plan.micro * plan.gas * plan.dp)
        if ds.zero_stage == 3:
            # ZeRO-3's default reduce-scatter path (stage3 __avg_scatter_grads) averages over the
            # whole world without the SP correction that ZeRO-1/2 and this path apply: the update
            # is 1/sp of the true one (pinned by test_stock_zero3_reduce_scatter_divides_the_update_by_sp).
            zero["reduce_scatter"] = False
    if dtype == "bfloat16" and ds.fp32_grad_accum:
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    if not trainable:
        return config

    torch_adam = (not on_cuda) if ds.torch_adam is None else bool(ds.torch_adam)
    config["optimizer"] = {
        "type": "AdamW",
        "params": {
            "lr": float(optim.lr),
            "betas": [float(b) for b in optim.betas],
            "eps": float(optim.eps),
            "weight_decay": float(optim.weight_decay),
            # False: FusedAdam on CUDA, DeepSpeedCPUAdam when the optimizer is offloaded.
            "torch_adam": torch_adam,
        },
    }
    scheduler = build_scheduler(optim)
    if scheduler is not None:
        config["scheduler"] = scheduler
    return config
