"""DeepSpeed JSON built by repro.config.ds_config: the six ZeRO benchmark cases and the GRPO actor."""

from __future__ import annotations

import pytest

from repro.config import DeepSpeedConfig, OptimConfig
from repro.config.ds_config import OffloadPlan, build_ds_config, build_scheduler, resolve_offload
from tests.unit.config.plans import BENCH_PLAN, role_plan


@pytest.mark.parametrize(
    ("stage", "offload", "param_offload", "want_opt", "want_param"),
    [
        (1, "none", False, None, None),
        (1, "cpu", False, "cpu", None),
        (2, "none", False, None, None),
        (2, "cpu", False, "cpu", None),
        (3, "none", False, None, None),
        (3, "cpu", False, "cpu", None),
        (3, "cpu", True, "cpu", "cpu"),
    ],
)
def test_zero_benchmark_cases_on_cuda(stage, offload, param_offload, want_opt, want_param):
    ds = DeepSpeedConfig(zero_stage=stage, offload=offload, param_offload=param_offload, fp32_grad_accum=False)
    cfg = build_ds_config(ds, OptimConfig(lr=1e-6), BENCH_PLAN, grad_clip=1.0, on_cuda=True)
    zero = cfg["zero_optimization"]
    assert zero["stage"] == stage
    assert zero.get("offload_optimizer", {}).get("device") == want_opt
    assert zero.get("offload_param", {}).get("device") == want_param
    assert ("allgather_bucket_size" in zero) == (stage < 3)
    assert cfg["bf16"] == {"enabled": True}
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (16, 2, 4)
    # FusedAdam on CUDA, DeepSpeedCPUAdam when offloaded: DeepSpeed decides from torch_adam=False.
    assert cfg["optimizer"] == {
        "type": "AdamW",
        "params": {"lr": 1e-6, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01, "torch_adam": False},
    }
    assert cfg["gradient_clipping"] == 1.0
    assert "scheduler" not in cfg  # constant LR, no warm-up
    assert cfg["wall_clock_breakdown"] is False and cfg["steps_per_print"] >= 10**6
    assert cfg["timers"] == {"throughput": {"enabled": False}}  # no device sync around every forward
    assert "data_types" not in cfg


def test_zero1_cpu_offloads_the_optimizer_unlike_verls_seed():
    # verl's seed normalised ZeRO-1 + cpu to no offload; DeepSpeed's stage-1/2 optimizer offloads
    # at stage 1 too (tests/distributed/workers/test_placement.py reads it back from the engine).
    assert resolve_offload(1, "cpu", False, None) == OffloadPlan("cpu", "none", None, None)
    assert resolve_offload(1, "auto", False, None) == OffloadPlan("cpu", "none", None, None)
    assert "ZeRO-1 offloads the optimizer" in resolve_offload(1, "cpu", True, None).note


def test_param_offload_only_at_zero3():
    assert resolve_offload(2, "cpu", True, None).param == "none"
    assert resolve_offload(3, "cpu", True, None).param == "cpu"
    assert resolve_offload(3, "none", True, None) == OffloadPlan("none", "none", None, None)


def test_nvme_configures_swap_path_at_zero3(tmp_path):
    ds = DeepSpeedConfig(zero_stage=3, offload="nvme", offload_dir=str(tmp_path), param_offload=True)
    zero = build_ds_config(ds, OptimConfig(), BENCH_PLAN, grad_clip=1.0, on_cuda=True)["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "nvme", "pin_memory": True, "nvme_path": str(tmp_path)}
    assert zero["offload_param"] == {"device": "nvme", "pin_memory": True, "nvme_path": str(tmp_path)}


def test_nvme_without_dir_or_below_zero3_is_refused():
    with pytest.raises(ValueError, match="deepspeed.offload_dir"):
        resolve_offload(3, "nvme", False, None)
    with pytest.raises(ValueError, match="zero_stage=3"):
        resolve_offload(2, "nvme", False, "/nvme")


def test_the_boundary_rechecks_a_section_edited_after_it_was_built():
    """build_ds_config re-runs each section's own checks (the one place its keys are validated)
    instead of restating them: an edited section gets the message it would have got when built."""
    for key, bad in (("zero_stage", 4), ("offload", "disk"), ("model_dtype", "fp16")):
        ds = DeepSpeedConfig()
        setattr(ds, key, bad)
        with pytest.raises(ValueError, match=rf"^DeepSpeedConfig\.{key}={bad!r} is not valid; choose one of"):
            build_ds_config(ds, OptimConfig(), BENCH_PLAN, grad_clip=1.0, on_cuda=True)
    optim = OptimConfig()
    optim.warmup_style = "polynomial"
    with pytest.raises(ValueError, match=r"^OptimConfig\.warmup_style='polynomial' is not valid; choose one of"):
        build_scheduler(optim)


def test_cpu_defaults_to_fp32_and_torch_adam_even_with_offload():
    ds = DeepSpeedConfig(zero_stage=3, offload="cpu", param_offload=True, fp32_grad_accum=True)
    cfg = build_ds_config(ds, OptimConfig(), BENCH_PLAN, grad_clip=0.0, on_cuda=False)
    assert cfg["bf16"] == {"enabled": False}
    assert cfg["optimizer"]["params"]["torch_adam"] is True
    assert cfg["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": False}
    assert cfg["gradient_clipping"] == 0.0
    assert "data_types" not in cfg  # fp32 model: accumulation is fp32 already


def test_fp32_grad_accum_uses_deepspeed_data_types():
    ds = DeepSpeedConfig(zero_stage=2, model_dtype="bfloat16", fp32_grad_accum=True)
    cfg = build_ds_config(ds, OptimConfig(), BENCH_PLAN, grad_clip=1.0, on_cuda=False)
    assert cfg["bf16"] == {"enabled": True}
    assert cfg["data_types"] == {"grad_accum_dtype": "fp32"}


def test_grpo_reference_command_actor_config():
    # actor_rollout_ref.actor.strategy=deepspeed data.train_batch_size=128 rollout.n=5
    # actor.ppo_mini_batch_size=64 actor.ppo_micro_batch_size_per_gpu=8 optim.lr=1e-6
    # actor.deepspeed.zero_stage=2 trainer.n_gpus_per_node=2 (grad_clip 1.0)
    plan = role_plan(dp=2, mini_samples=64 * 5, micro=8, samples_per_step=128 * 5)
    ds = DeepSpeedConfig(zero_stage=2, offload="none", param_offload=False, fp32_grad_accum=False)
    cfg = build_ds_config(ds, OptimConfig(lr=1e-6), plan, grad_clip=1.0, on_cuda=True)
    assert cfg == {
        "train_batch_size": 320,
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 20,
        "zero_optimization": {
            "stage": 2,
            "reduce_bucket_size": 500_000_000,
            "contiguous_gradients": True,
            "allgather_bucket_size": 500_000_000,
        },
        "bf16": {"enabled": True},
        "fp16": {"enabled": False},
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "timers": {"throughput": {"enabled": False}},
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 1e-6, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01, "torch_adam": False},
        },
    }


def test_frozen_role_has_no_optimizer_nor_optimizer_offload():
    ds = DeepSpeedConfig(zero_stage=3, offload="cpu", param_offload=True)
    cfg = build_ds_config(ds, OptimConfig(), BENCH_PLAN, grad_clip=1.0, on_cuda=True, trainable=False)
    assert "optimizer" not in cfg and "scheduler" not in cfg
    assert "offload_optimizer" not in cfg["zero_optimization"]
    assert cfg["zero_optimization"]["offload_param"]["device"] == "cpu"


def test_schedules_follow_warmup_style_and_ratio():
    constant = build_scheduler(OptimConfig(lr=1e-3, lr_warmup_steps=5))
    assert constant == {"type": "WarmupLR", "params": {
        "warmup_min_lr": 0.0, "warmup_max_lr": 1e-3, "warmup_num_steps": 5, "warmup_type": "linear"}}
    cosine = build_scheduler(OptimConfig(lr=1e-3, warmup_style="cosine", lr_warmup_steps_ratio=0.1,
                                         total_training_steps=50, min_lr_ratio=0.1))
    assert cosine["type"] == "WarmupCosineLR"
    assert cosine["params"]["warmup_num_steps"] == 5 and cosine["params"]["total_num_steps"] == 50
    assert cosine["params"]["cos_min_ratio"] == 0.1
    linear = build_scheduler(OptimConfig(lr=1e-3, warmup_style="linear", total_training_steps=20))
    assert linear["type"] == "WarmupDecayLR" and linear["params"]["warmup_min_lr"] == 0.0
    with pytest.raises(ValueError, match="optim.total_training_steps"):
        build_scheduler(OptimConfig(warmup_style="cosine"))
    with pytest.raises(ValueError, match="optim.total_training_steps"):
        build_scheduler(OptimConfig(lr_warmup_steps_ratio=0.1))


def test_deepspeed_accepts_the_built_schedules():
    import torch
    from deepspeed.runtime.lr_schedules import WarmupCosineLR, WarmupDecayLR, WarmupLR

    classes = {"WarmupLR": WarmupLR, "WarmupDecayLR": WarmupDecayLR, "WarmupCosineLR": WarmupCosineLR}
    for style, kwargs in [("constant", {"lr_warmup_steps": 3}), ("linear", {"total_training_steps": 10}),
                          ("cosine", {"total_training_steps": 10, "lr_warmup_steps": 2})]:
        sched = build_scheduler(OptimConfig(lr=1e-2, warmup_style=style, **kwargs))
        opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-2)
        runner = classes[sched["type"]](opt, **sched["params"])
        lrs = []
        for _ in range(12):
            runner.step()
            lrs.append(opt.param_groups[0]["lr"])
        assert 0.9e-2 <= max(lrs) <= 1e-2 + 1e-12
        if style != "constant":
            assert lrs[-1] < 1e-2


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_sequence_parallel_counts_dp_ranks_and_turns_off_zero3_reduce_scatter(stage):
    from dataclasses import replace

    plan = replace(BENCH_PLAN, world=4, dp=2, sp=2, train_batch_size=2 * 4 * 2 * 2)  # micro 2, GAS 4, dp 2, sp 2
    conf = build_ds_config(DeepSpeedConfig(zero_stage=stage), OptimConfig(), plan, grad_clip=1.0, on_cuda=True)
    # given the SP mpu, DeepSpeed checks train_batch_size against micro * GAS * (world / sp)
    assert conf["train_batch_size"] == 2 * 4 * 2
    # the stock ZeRO-3 reduce-scatter path halves the SP gradient (test_ulysses pins it)
    assert conf["zero_optimization"].get("reduce_scatter", True) is (stage != 3)
    assert build_ds_config(DeepSpeedConfig(zero_stage=stage), OptimConfig(), BENCH_PLAN, grad_clip=1.0,
                           on_cuda=True)["zero_optimization"].get("reduce_scatter", True) is True


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_overlap_comm_is_deepspeeds_default_unless_set(stage):
    # Unset, the key stays out and DeepSpeed decides (on at ZeRO-3 only); set, it reaches DeepSpeed as given.
    plan = BENCH_PLAN
    unset = build_ds_config(DeepSpeedConfig(zero_stage=stage), OptimConfig(), plan, grad_clip=1.0, on_cuda=True)
    assert "overlap_comm" not in unset["zero_optimization"]
    for value in (True, False):
        cfg = build_ds_config(DeepSpeedConfig(zero_stage=stage, overlap_comm=value), OptimConfig(), plan,
                              grad_clip=1.0, on_cuda=True)
        assert cfg["zero_optimization"]["overlap_comm"] is value


def test_memory_efficient_linear_is_a_zero3_key_and_deepspeeds_default_unless_set():
    # Unset, the key stays out (DeepSpeed: on); set at ZeRO-3 it reaches DeepSpeed; below ZeRO-3 it is an error
    # that names the key (DeepSpeed would ignore it there, silently).
    unset = build_ds_config(DeepSpeedConfig(zero_stage=3), OptimConfig(), BENCH_PLAN, grad_clip=1.0, on_cuda=True)
    assert "memory_efficient_linear" not in unset["zero_optimization"]
    off = build_ds_config(DeepSpeedConfig(zero_stage=3, memory_efficient_linear=False), OptimConfig(), BENCH_PLAN,
                          grad_clip=1.0, on_cuda=True)
    assert off["zero_optimization"]["memory_efficient_linear"] is False
    with pytest.raises(ValueError, match="memory_efficient_linear.*ZeRO-3 key; zero_stage is 2"):
        DeepSpeedConfig(zero_stage=2, memory_efficient_linear=False)
