"""Config building (repro.config.loader.load_config): verl command lines, validation, warnings, env knobs."""

from __future__ import annotations

import importlib.util
import os

import pytest

from repro.config import DeepSpeedConfig, RunConfig, critic_enabled, resolve_env_knobs
from repro.config.loader import (
    check_overrides,
    close_matches,
    config_keys,
    load_config,
)
from repro.config.rules import validate_run_config
from tests.unit.config.loading import load


def test_default_config_is_valid():
    cfg, notes = load([])
    assert isinstance(cfg, RunConfig) and notes == []
    assert cfg.actor_rollout_ref.actor.deepspeed.param_offload is False


def test_group_aliases_select_the_deepspeed_workers():
    # Both spellings compose (older_form_aliases covers deepspeed_actor / deepspeed_critic).
    assert check_overrides(["actor@actor_rollout_ref.actor=deepspeed_actor", "critic=ds_critic"])[0] == [
        "actor@actor_rollout_ref.actor=deepspeed_actor",
        "critic=ds_critic",
    ]
    with pytest.raises(
        ValueError, match=r"critic='dp_critic' is not an option.*\['ds_critic', 'deepspeed_critic'\]"
    ):
        load(["critic=dp_critic"])
    with pytest.raises(ValueError, match="write actor@actor_rollout_ref.actor=ds_actor"):
        load(["actor=ds_actor"])


def test_unknown_key_lists_close_matches():
    with pytest.raises(ValueError) as info:
        load(["critic.deepspeed.zero_stage=3"])
    assert "unknown config key 'critic.deepspeed.zero_stage'" in str(info.value)
    assert "critic.deepspeed_config.zero_stage" in str(info.value)
    with pytest.raises(ValueError, match="did you mean actor_rollout_ref.actor.ppo_mini_batch_size"):
        load(["actor_rollout_ref.actor.ppo_mini_batch_sise=32"])
    with pytest.raises(ValueError, match="no similar key"):
        load(["zzzz=1"])


def test_close_matches_finds_renamed_sections_and_same_leaf_names():
    keys, _ = config_keys()
    assert "actor_rollout_ref.actor.deepspeed.offload" in close_matches(
        "actor_rollout_ref.actor.deepspeed_config.offload", keys
    )
    assert "trainer.total_training_steps" in close_matches("trainer.total_train_steps", keys)


def test_open_dict_keys_work_with_and_without_plus():
    lines, _ = check_overrides(
        ["reward.reward_kwargs.score=2", "+ray_kwargs.ray_init.num_cpus=2", "+data.seed=3"]
    )
    assert lines == ["++reward.reward_kwargs.score=2", "++ray_kwargs.ray_init.num_cpus=2", "++data.seed=3"]
    cfg, _ = load(lines)
    assert (cfg.reward.reward_kwargs, cfg.ray_kwargs.ray_init, cfg.data.seed) == (
        {"score": 2},
        {"num_cpus": 2},
        3,
    )


def test_hydra_own_keys_are_dropped_with_a_note():
    lines, notes = check_overrides(["hydra.run.dir=/tmp/x", "trainer.seed=2"])
    assert lines == ["trainer.seed=2"] and "hydra.run.dir: ignored" in notes[0]


def test_deleting_keys_is_refused():
    with pytest.raises(ValueError, match="deleting config keys is not supported"):
        load(["~trainer.logger"])


# The seed's 4-GPU keys (results/4gpu/README.md) on the 0.6B preset: token budgets off, update micro 16.
FOUR_GPU_KEYS = ["trainer.n_gpus_per_node=4", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                 "data.train_batch_size=128", "actor_rollout_ref.actor.ppo_mini_batch_size=128",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.actor.use_dynamic_bsz=False",
                 "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=False", "trainer.dry_run=true"]


def _log_prob_notes(overrides):
    _, notes = load(overrides, config_name="grpo_0p6b")
    return [n for n in notes if "log-prob pass" in n]


def test_a_log_prob_micro_batch_below_the_updates_is_named_with_the_value_to_set():
    # The preset's nominal log-prob micro-batch of 1 (its token budget decides) is inherited when the
    # budgets go off: one sample a forward, 66% of a dp=2 x sp=2 step on 4 H100s.
    (note,) = _log_prob_notes(FOUR_GPU_KEYS)
    assert note.startswith("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 with ")
    assert "set it to 16 or more" in note
    assert _log_prob_notes([*FOUR_GPU_KEYS, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16"]) == []
    assert _log_prob_notes([*FOUR_GPU_KEYS, "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True"]) == []
    assert _log_prob_notes(["trainer.dry_run=true"]) == []  # the preset as it is: token budgets on


def _one_rank_notes(overrides, config_name="ppo_trainer"):
    _, notes = load(["trainer.dry_run=true", *overrides], config_name=config_name)
    return [n for n in notes if "on one GPU with" in n]


def test_zero2_on_one_gpu_with_several_micro_batches_names_zero1_per_role():
    # ZeRO-2 partitions nothing on one rank but still reduces after every micro-batch (measured 1.03-1.40x slower
    # than ZeRO-1 at four micro-batches on one H100); a note per role that has it, none where it cannot matter.
    actor, critic = _one_rank_notes(["trainer.n_gpus_per_node=1"])
    assert actor.startswith("actor_rollout_ref.actor.deepspeed.zero_stage=2 on one GPU with 32 ")
    assert "actor_rollout_ref.actor.deepspeed.zero_stage=1 runs them once an update" in actor
    assert critic.startswith("critic.deepspeed_config.zero_stage=2 on one GPU")
    (only,) = _one_rank_notes(["trainer.n_gpus_per_node=1", "actor_rollout_ref.actor.deepspeed.zero_stage=1"])
    assert only.startswith("critic.")
    assert "token-budget micro-batches" in _one_rank_notes(["trainer.n_gpus_per_node=1"], config_name="grpo_0p6b")[0]
    assert _one_rank_notes([]) == []  # two ranks: ZeRO-2 partitions the gradients
    # two GPUs in one sequence-parallel group: one data-parallel rank, but DeepSpeed partitions over the SP ranks
    assert _one_rank_notes(["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "critic.enable=False",
                            "algorithm.adv_estimator=grpo"]) == []
    one_micro_batch = ["trainer.n_gpus_per_node=1", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=1",
                       *(f"{role}.{key}=8" for role in ("actor_rollout_ref.actor", "critic")
                         for key in ("ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu"))]
    assert _one_rank_notes(one_micro_batch) == []  # nothing to accumulate: ZeRO-2 reduces once either way


def test_no_effect_keys_warn_once_each():
    _, notes = load(
        [
            "trainer.use_legacy_worker_impl=enable",
            "reward.num_workers=4",
            "actor_rollout_ref.rollout.mode=async",
        ]
    )
    assert len(notes) == 3
    assert sum("trainer.use_legacy_worker_impl" in n for n in notes) == 1
    assert any("reward.num_workers=4 has no effect here" in n for n in notes)
    # At their defaults they are silent (test_default_config_is_valid), and vLLM keys are meant for vLLM.
    notes = validate_run_config(
        run_config(
            actor_rollout_ref__rollout__name="vllm",
            trainer__dry_run=True,
            actor_rollout_ref__rollout__max_num_seqs=8,
        )
    )
    assert not any("max_num_seqs" in n for n in notes)


def test_field_errors_name_the_full_key_of_each_deepspeed_section():
    for path in (
        "actor_rollout_ref.actor.deepspeed",
        "critic.deepspeed_config",
        "actor_rollout_ref.ref.deepspeed",
    ):
        with pytest.raises(
            ValueError, match=rf"^{path}\.zero_stage=4 is not valid; choose one of \[1, 2, 3\]"
        ):
            load([f"{path}.zero_stage=4"])
    with pytest.raises(ValueError, match=r"reward\.reward_kwargs\.method='loose' is not valid.*flexible"):
        load(["+reward.reward_kwargs.method=loose"])


def test_type_errors_and_unexpanded_shell_variables_name_the_key():
    with pytest.raises(
        ValueError, match="actor_rollout_ref.actor.ppo_mini_batch_size.*could not be converted"
    ):
        load(["actor_rollout_ref.actor.ppo_mini_batch_size=abc"])
    with pytest.raises(ValueError, match=r"data\.train_files.*DATA_TRAIN.*shell variable"):
        load(["data.train_files=${DATA_TRAIN}"])


def run_config(**sections) -> RunConfig:
    """A RunConfig built in code (no Hydra), for the cross-section rules of validate_run_config."""
    cfg = RunConfig()
    for dotted, value in sections.items():
        *parents, leaf = dotted.split("__")
        node = cfg
        for name in parents:
            node = getattr(node, name)
        setattr(node, leaf, value)
    return cfg


def test_bad_batch_split_is_a_value_error_with_nearest_values():
    with pytest.raises(
        ValueError, match=r"actor_rollout_ref\.actor\.ppo_mini_batch_size=33 .*dp=2.*32 or 64"
    ):
        load(["data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=33"])
    # The critic has its own keys and is checked only when it is trained.
    with pytest.raises(ValueError, match=r"critic\.ppo_mini_batch_size=33"):
        validate_run_config(run_config(critic__ppo_mini_batch_size=33))
    validate_run_config(
        run_config(critic__ppo_mini_batch_size=33, critic__enable=False, algorithm__adv_estimator="grpo")
    )


def test_deprecated_global_micro_batch_replaces_the_per_gpu_default():
    cfg, notes = load(
        [
            "data.train_batch_size=256",
            "actor_rollout_ref.actor.ppo_mini_batch_size=32",
            "actor_rollout_ref.actor.ppo_micro_batch_size=8",
        ]
    )
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is None
    assert any("ppo_micro_batch_size is deprecated" in n for n in notes)


def test_sequence_parallel_is_accepted_with_one_size_per_process():
    validate_run_config(run_config(critic__ulysses_sequence_parallel_size=2, critic__enable=True))
    validate_run_config(run_config(actor_rollout_ref__actor__ulysses_sequence_parallel_size=2, trainer__dry_run=True))
    with pytest.raises(ValueError, match=r"ulysses_sequence_parallel_size=2 and critic\.ulysses_sequence_parallel_size=4"):
        validate_run_config(run_config(actor_rollout_ref__actor__ulysses_sequence_parallel_size=2, critic__enable=True,
                                       critic__ulysses_sequence_parallel_size=4, trainer__n_gpus_per_node=4))


def test_sequence_parallel_size_is_checked_once_for_every_role():
    """One check (repro.config.fields.check_sp_size) for the actor's and the critic's key, named in full."""
    for key in ("actor_rollout_ref.actor.ulysses_sequence_parallel_size", "critic.ulysses_sequence_parallel_size"):
        with pytest.raises(ValueError, match=rf"^{key}=0 must be an integer >= 1$"):
            load([f"{key}=0"])
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.actor\.ulysses_sequence_parallel_size=3 does not divide "
                                         r"the world size 2 \(trainer\.n_gpus_per_node=2 x trainer\.nnodes=1\); "
                                         r"it must be one of \[1, 2\]"):
        load(["actor_rollout_ref.actor.ulysses_sequence_parallel_size=3"])


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vllm_without_vllm_fails_a_real_run_and_warns_in_a_dry_run():
    with pytest.raises(ValueError, match=r"rollout\.name=vllm needs the vllm package.*rollout\.name=hf"):
        validate_run_config(run_config(actor_rollout_ref__rollout__name="vllm"))
    notes = validate_run_config(run_config(actor_rollout_ref__rollout__name="vllm", trainer__dry_run=True))
    assert any("rollout.name=hf (a real run fails here)" in n for n in notes)


def test_missing_model_and_data_fail_a_real_run_naming_the_key(tmp_path):
    with pytest.raises(
        ValueError, match=r"actor_rollout_ref\.model\.path='Qwen/Qwen3-0\.6B' is not a local directory"
    ):
        validate_run_config(run_config(actor_rollout_ref__model__path="Qwen/Qwen3-0.6B"))
    with pytest.raises(ValueError, match=r"data\.train_files: '.*missing\.parquet' does not exist"):
        validate_run_config(run_config(data__train_files=f"{tmp_path}/missing.parquet"))
    (tmp_path / "train.parquet").write_bytes(b"")
    validate_run_config(
        run_config(
            data__train_files=[f"{tmp_path}/train.parquet"], actor_rollout_ref__model__path=str(tmp_path)
        )
    )


def test_nvme_offload_needs_zero3_and_an_offload_dir():
    cfg = run_config()
    cfg.actor_rollout_ref.actor.deepspeed = DeepSpeedConfig(zero_stage=3, offload="nvme")
    with pytest.raises(
        ValueError, match=r"actor_rollout_ref\.actor\.deepspeed\.offload=nvme needs .*offload_dir"
    ):
        validate_run_config(cfg)
    cfg.actor_rollout_ref.actor.deepspeed.offload_dir = "/tmp"
    validate_run_config(cfg)
    cfg.critic.deepspeed_config = DeepSpeedConfig(zero_stage=2, offload="nvme", offload_dir="/tmp")
    with pytest.raises(
        ValueError,
        match=r"critic\.deepspeed_config\.offload=nvme needs critic\.deepspeed_config\.zero_stage=3",
    ):
        validate_run_config(cfg)


def test_critic_rules_follow_the_advantage_estimator():
    with pytest.raises(ValueError, match="algorithm.adv_estimator=gae needs a critic.*critic.enable=True"):
        validate_run_config(run_config(critic__enable=False))
    cfg = run_config(algorithm__adv_estimator="grpo")
    assert not critic_enabled(cfg) and any("advantage is its raw score" in n for n in validate_run_config(cfg))


def test_skipping_empty_micro_batches_is_refused_in_data_parallel():
    with pytest.raises(ValueError, match="skip_inactive_micro_batches=True with 2 data-parallel ranks"):
        validate_run_config(run_config(actor_rollout_ref__actor__skip_inactive_micro_batches=True))
    validate_run_config(
        run_config(
            actor_rollout_ref__actor__skip_inactive_micro_batches=True,
            actor_rollout_ref__actor__unsafe_allow_skip_in_data_parallel=True,
        )
    )
    validate_run_config(
        run_config(actor_rollout_ref__actor__skip_inactive_micro_batches=True, trainer__n_gpus_per_node=1)
    )


def test_env_knobs_are_read_from_the_given_environment_once():
    env = {
        "VERL_ENABLE_PARAM_OFFLOAD": "1",
        "VERL_DS_ZERO2_FP32_ACCUM_PATCH": "1",
        "VERL_DS_ZERO2_STEP_EACH_MICRO": "1",
    }
    cfg, _ = load(["critic.deepspeed_config.param_offload=false"], env)
    for ds in (cfg.actor_rollout_ref.actor.deepspeed, cfg.actor_rollout_ref.ref.deepspeed):
        assert (ds.param_offload, ds.fp32_grad_accum, ds.step_each_micro) == (True, True, True)
    assert cfg.critic.deepspeed_config.param_offload is False  # an explicit key beats the environment
    os.environ["VERL_ENABLE_PARAM_OFFLOAD"] = "0"  # after building: the config keeps what it read
    try:
        assert cfg.actor_rollout_ref.actor.deepspeed.param_offload is True
    finally:
        del os.environ["VERL_ENABLE_PARAM_OFFLOAD"]
    with pytest.raises(ValueError, match="VERL_DS_ZERO2_STEP_EACH_MICRO='yes' must be 0 or 1"):
        resolve_env_knobs(DeepSpeedConfig(), {"VERL_DS_ZERO2_STEP_EACH_MICRO": "yes"})


def test_loading_has_no_hydra_side_effects(tmp_path, monkeypatch):
    from hydra import initialize
    from hydra.core.global_hydra import GlobalHydra

    monkeypatch.chdir(tmp_path)
    load(["trainer.experiment_name=x"])
    assert list(tmp_path.iterdir()) == [] and not GlobalHydra.instance().is_initialized()
    with initialize(version_base="1.3", config_path=None):  # a caller's own Hydra survives a load
        outer = GlobalHydra.instance().hydra
        load(["trainer.experiment_name=y"])
        assert GlobalHydra.instance().hydra is outer


def test_sections_validate_themselves_when_built_in_code():
    with pytest.raises(ValueError, match=r"DeepSpeedConfig\.offload='disk' is not valid"):
        DeepSpeedConfig(offload="disk")


def test_unknown_config_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"config name 'ppo_megatron_trainer' is not known.*ppo_trainer"):
        load_config([], config_name="ppo_megatron_trainer")


def test_loss_scale_factor_is_verls_key_on_the_actor_and_the_critic():
    cfg, _ = load(["actor_rollout_ref.actor.loss_scale_factor=4096", "critic.loss_scale_factor=512"])
    assert cfg.actor_rollout_ref.actor.loss_scale_factor == 4096 and cfg.critic.loss_scale_factor == 512
    assert load([])[0].actor_rollout_ref.actor.loss_scale_factor is None  # verl's default: the padded width
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.actor\.loss_scale_factor=0(\.0)? must be a positive number"):
        load(["actor_rollout_ref.actor.loss_scale_factor=0"])


def test_compiled_layers_are_refused_where_they_cannot_run_naming_both_keys(monkeypatch):
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    cfg = run_config(actor_rollout_ref__model__compile_layers="inductor")
    validate_run_config(cfg)  # ZeRO-2 (the default): compiled layers run
    cfg.actor_rollout_ref.actor.deepspeed = DeepSpeedConfig(zero_stage=3)
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.model\.compile_layers=inductor with "
                                         r"actor_rollout_ref\.actor\.deepspeed\.zero_stage=3: zero_stage=3 is not "
                                         r"valid; choose 0, 1 or 2"):
        validate_run_config(cfg)
    critic = run_config(critic__model__compile_layers="aot_eager")
    critic.critic.deepspeed_config = DeepSpeedConfig(zero_stage=3)
    with pytest.raises(ValueError, match=r"^critic\.model\.compile_layers=aot_eager with critic\.deepspeed_config\."
                                         r"zero_stage=3"):
        validate_run_config(critic)
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")  # torch.compile would silently do nothing
    with pytest.raises(ValueError, match="TORCHDYNAMO_DISABLE=1 makes torch.compile do nothing; unset it"):
        validate_run_config(run_config(actor_rollout_ref__model__compile_layers="inductor"))
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.model\.compile_layers=.*max-autotune.* is not valid; "
                                         r"choose one of \['off', 'inductor', 'aot_eager'\]"):
        load(["actor_rollout_ref.model.compile_layers=max-autotune"])


def test_flash_attention_names_torchs_kernels_or_fa4_and_nothing_else():
    assert run_config(actor_rollout_ref__model__flash_attention="fa4").actor_rollout_ref.model.flash_attention == "fa4"
    assert run_config(critic__model__flash_attention="fa4").critic.model.flash_attention == "fa4"
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.model\.flash_attention=.*FA3.* is not valid; "
                                         r"choose one of \['torch', 'fa4'\]"):
        load(["actor_rollout_ref.model.flash_attention=FA3"])
