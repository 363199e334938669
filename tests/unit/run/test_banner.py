"""The setup banner: runs that differ in ZeRO stage, offload, LoRA, SP or remove-padding print differently."""

from __future__ import annotations

from repro.config.loader import load_config
from repro.config.presets import preset_overrides
from repro.run.banner import banner_lines

ZERO2 = {"actor": {"stage": 2, "optimizer": "device", "param": "device"}}


def _banner(*overrides: str, engines=ZERO2) -> list[str]:
    cfg = load_config([*preset_overrides("grpo_tiny"), "trainer.device=cpu", *overrides], config_name="ppo_trainer")
    return banner_lines(cfg, engines, gpu=False)


def test_the_tiny_job_banner_names_engine_stage_offload_split_rollout_and_lora():
    lines = _banner()
    assert lines[0] == "setup: DeepSpeed engine (deepspeed), grpo, 2 CPU rank(s) on 1 node(s)"
    assert lines[1] == ("  actor: ZeRO-2, offload (read back) optimizer=device param=device, dp 2 x sp 1, "
                        "micro 64 x GAS 1 per rank, 2 mini-batch(es) x 2 epoch(s)/step, remove-padding off, LoRA off")
    assert lines[2] == "  rollout: hf, 32 prompts x n=8, temperature 1.0, 12 new tokens"


def test_zero3_offload_lora_sp_and_remove_padding_each_change_the_banner():
    base = _banner()
    zero3 = _banner("actor_rollout_ref.actor.deepspeed.zero_stage=3", "actor_rollout_ref.actor.deepspeed.offload=cpu",
                    engines={"actor": {"stage": 3, "optimizer": "cpu_offload", "param": "device"}})
    assert "ZeRO-3, offload (read back) optimizer=cpu param=device" in zero3[1]
    lora = _banner("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16")
    assert lora[1].endswith("LoRA rank 8 alpha 16")
    sp = _banner("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2")
    assert "dp 1 x sp 2, micro 64 x GAS 2 per rank" in sp[1]
    rmpad = _banner("actor_rollout_ref.model.use_remove_padding=True")
    assert "remove-padding on" in rmpad[1]
    assert len({"\n".join(b) for b in (base, zero3, lora, sp, rmpad)}) == 5


def test_the_offload_shown_is_the_engines_not_the_configs():
    # ZeRO-2 with offload=cpu asked, but an engine that kept its optimizer on the device says so.
    asked = _banner("actor_rollout_ref.actor.deepspeed.offload=cpu")
    assert "optimizer=device" in asked[1]


def test_lora_sp_and_the_rollout_show_what_the_engines_read_back():
    # engine_setup's report (repro.workers.engaged): the banner prints what was built beside what was asked.
    built = {"actor": {**ZERO2["actor"], "sp": 2, "lora_layers": 14, "optimizer_base_params": 0},
             "rollout": {"rollout": "HFRollout", "engine": "Qwen3ForCausalLM"}}
    lines = _banner("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16",
                    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", engines=built)
    assert "dp 1 x sp 2 (read back sp 2)" in lines[1]
    assert lines[1].endswith("LoRA rank 8 alpha 16 (read back: 14 adapter layers, 0 base params in the optimizer)")
    assert lines[2].endswith("; built (read back): HFRollout (Qwen3ForCausalLM)")
    # a LoRA config whose engine holds no adapter prints no adapter count
    bare = _banner("actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=16")
    assert "read back:" not in bare[1]


def test_the_fused_norms_show_only_where_the_engine_runs_them():
    # rms_norm.fused_count is 0 on a CPU (eager norms) and every norm on CUDA in half precision.
    fused = _banner(engines={"actor": {**ZERO2["actor"], "fused_rms_norms": 113}})
    assert ", fused RMSNorm (read back: 113 norms), " in fused[1]
    assert "RMSNorm" not in _banner(engines={"actor": {**ZERO2["actor"], "fused_rms_norms": 0}})[1]


def test_compiled_layers_show_only_where_the_engine_reports_them():
    # model.compile_layers asked, the module's compiled calls counted (repro.workers.layer_compile.compiled_layers)
    assert ", compiled layers (read back: 28)" in _banner(engines={"actor": {**ZERO2["actor"], "compiled_layers": 28}})[1]
    assert "compiled layers" not in _banner(engines={"actor": {**ZERO2["actor"], "compiled_layers": 0}})[1]


def test_an_sp_group_the_engine_did_not_build_shows_as_read_back():
    # asked for sp=2, the engine reports no sequence-parallel group: the banner says so, not the config
    lines = _banner("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", engines={"actor": {**ZERO2["actor"], "sp": 1}})
    assert "dp 1 x sp 2 (read back sp 1)" in lines[1]


def test_zero3_layout_shows_what_the_engine_reports_and_nothing_below_zero3():
    # engine_report's ZeRO-3 read-backs (repro.workers.engaged): two runs asking for the same keys print differently
    # when DeepSpeed kept different things, and a ZeRO-2 engine prints none of it.
    zero3 = {"stage": 3, "optimizer": "device", "param": "device", "zero3_leaves": [], "linear": "torch",
             "zero3_persistent_params": 309, "zero3_persistent_gather": "coalesced", "zero3_hooked_modules": 3}
    keys = ("actor_rollout_ref.actor.deepspeed.zero_stage=3",)
    lines = _banner(*keys, engines={"actor": zero3})
    assert ", ZeRO-3 read back [0 leaf modules, linear torch, 309 parameters whole (gathered coalesced), " \
           "3 modules hooked], LoRA off" in lines[1]
    hooked = _banner(*keys, engines={"actor": {**zero3, "zero3_hooked_modules": 35}})
    assert "35 modules hooked" in hooked[1] and hooked[1] != lines[1]
    assert "ZeRO-3 read back" not in _banner(engines={"actor": {**ZERO2["actor"], "zero3_persistent_params": 0}})[1]
