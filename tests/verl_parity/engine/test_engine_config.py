"""The verl side of the DeepSpeed engine without ranks: plugin loading, Hydra composition, config errors.

- the ``verl.plugins`` entry point declared in pyproject.toml, loaded by verl's own loader on
  ``import verl`` (a throwaway dist-info carries the declaration; nothing is pip-installed), and a
  broken one that says so at error level (verl itself logs it at debug level only);
- ``model_engine=deepspeed`` composed by verl's trainer config (``ppo_trainer``) with repro's
  search path, instantiated into the engine's dataclasses for actor, ref (as verl's worker
  rewrites it) and critic;
- unknown, invalid and contradictory keys: one line naming the key and the valid choices;
- the env knobs mean what they mean in repro (same resolver).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import tomllib

from tests.distributed.workers.helpers import make_model_dir
from tests.subprocess_env import pythonpath
from tests.verl_parity.engine.harness import SEARCHPATH, ref_as_verl_worker_builds_it

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _import_verl(tmp_path: pathlib.Path, probe: str, *, break_engine: bool = False):
    """``import verl`` in a fresh process that sees repro's ``verl.plugins`` entry point as
    pyproject.toml declares it (a throwaway dist-info; nothing is pip-installed), then ``probe``.
    ``break_engine``: the engine module fails to import (``sitecustomize`` poisons its
    ``sys.modules`` entry), as it would if a verl API it uses moved."""
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["verl.plugins"]
    dist = tmp_path / "repro_probe-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: repro-probe\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[verl.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    if break_engine:
        (tmp_path / "sitecustomize.py").write_text(
            "import sys\nsys.modules['repro.integrations.verl.engine'] = None\n")
    env = {**os.environ, "PYTHONPATH": pythonpath(tmp_path, ROOT), "DS_ACCELERATOR": "cpu",
           "VERL_USE_EXTERNAL_PLUGINS": "auto"}
    env.pop("VERL_USE_EXTERNAL_MODULES", None)  # the entry point alone
    return subprocess.run([sys.executable, "-W", "ignore", "-c", "import verl\n" + probe], env=env,
                          capture_output=True, text=True, timeout=300)


REGISTERED = ("from verl.workers.engine import EngineRegistry as R\n"
              "print(R._engines.get('language_model', {}).get('deepspeed'), "
              "R._engines.get('value_model', {}).get('deepspeed'))")


def test_entry_point_registers_the_engine_when_verl_is_imported(tmp_path: pathlib.Path) -> None:
    out = _import_verl(tmp_path, REGISTERED)
    assert out.returncode == 0, out.stderr[-3000:]
    # verl's registry, read after `import verl` alone: repro's classes under backend "deepspeed"
    assert "DeepSpeedEngine" in out.stdout.split("\n")[-2] and "DeepSpeedValueEngine" in out.stdout, out.stdout
    assert "did not register" not in out.stderr


def test_a_broken_plugin_says_so_at_error_level(tmp_path: pathlib.Path) -> None:
    # verl catches the failing entry point and logs it at debug level: without repro's own error
    # line, `import verl` would pass in silence and model_engine=deepspeed fail later, unexplained.
    out = _import_verl(tmp_path, REGISTERED, break_engine=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[-2] == "None None", out.stdout  # really not registered
    assert "repro's DeepSpeed engine for verl did not register" in out.stderr, out.stderr[-3000:]
    assert "repro.integrations.verl.engine" in out.stderr, out.stderr[-3000:]  # the cause, with its traceback


def _compose(*overrides: str):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=[
            "model_engine=deepspeed", SEARCHPATH, "actor_rollout_ref.model.path=/nonexistent",
            "critic.model.path=/nonexistent", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "critic.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
            *overrides])


def test_model_engine_deepspeed_composes_actor_ref_and_critic() -> None:
    from verl.utils.config import omega_conf_to_dataclass

    from repro.integrations.verl.config import (
        DeepSpeedActorConfig,
        DeepSpeedCriticConfig,
        DeepSpeedEngineConfig,
        DeepSpeedOptimizerConfig,
    )

    cfg = _compose("actor_rollout_ref.actor.deepspeed.zero_stage=3", "actor_rollout_ref.actor.deepspeed.offload=cpu",
                   "critic.deepspeed.zero_stage=1", "actor_rollout_ref.actor.optim.lr=3e-6")
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert isinstance(actor, DeepSpeedActorConfig) and isinstance(actor.engine, DeepSpeedEngineConfig)
    assert (actor.engine.zero_stage, actor.engine.offload, actor.engine.forward_only) == (3, "cpu", False)
    assert isinstance(actor.optim, DeepSpeedOptimizerConfig) and actor.optim.lr == 3e-6
    ref = omega_conf_to_dataclass(ref_as_verl_worker_builds_it(cfg))
    assert isinstance(ref, DeepSpeedActorConfig)
    assert (ref.engine.zero_stage, ref.engine.forward_only) == (3, True)  # follows the actor's stage
    from omegaconf import open_dict

    with open_dict(cfg.critic):  # verl's HFModelConfig of the critic would load /nonexistent: not ours to test
        cfg.critic.model = None
    critic = omega_conf_to_dataclass(cfg.critic)
    assert isinstance(critic, DeepSpeedCriticConfig) and critic.engine.zero_stage == 1


def test_engine_config_is_repros_deepspeed_section_and_verls_engine_config() -> None:
    """Every key is DeepSpeedEngineKeys' (repro's DeepSpeedConfig + verl's three) or verl's EngineConfig's;
    the generic keys the yaml sets are EngineConfig's (tests/unit/config/test_verl_engine_keys.py: the yaml)."""
    from dataclasses import fields

    from verl.workers.config.engine import EngineConfig

    from repro.integrations.verl.config import DeepSpeedEngineConfig
    from repro.integrations.verl.engine_keys import VERL_ENGINE_KEYS, DeepSpeedEngineKeys

    ours = {f.name for f in fields(DeepSpeedEngineKeys)}
    verls = {f.name for f in fields(EngineConfig)}
    assert {f.name for f in fields(DeepSpeedEngineConfig)} == ours | verls
    assert set(VERL_ENGINE_KEYS) <= verls
    defaults = {f.name: f.default for f in fields(DeepSpeedEngineConfig)}
    assert all(defaults[f.name] == f.default for f in fields(DeepSpeedEngineKeys))  # repro's defaults win


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return make_model_dir(tmp_path_factory.mktemp("model") / "model")


def test_the_layer_keys_reach_repros_model_section_through_verls_engine_section(monkeypatch, model_dir) -> None:
    """compile_layers and flash_attention: repro's model-section keys, engine keys in verl (its model section is
    verl's), read by the engine into the model section it builds from (``repro_model``)."""
    from verl.utils.config import omega_conf_to_dataclass

    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)  # the suites switch dynamo off; compile_layers refuses it
    from verl.workers.config import HFModelConfig

    from repro.integrations.verl.config import repro_model

    default = omega_conf_to_dataclass(_compose().actor_rollout_ref.actor)
    assert (default.engine.compile_layers, default.engine.flash_attention) == ("off", "torch")  # "off": a string
    p = "actor_rollout_ref.actor.deepspeed."
    actor = omega_conf_to_dataclass(_compose(f"{p}compile_layers=aot_eager", f"{p}flash_attention=fa4")
                                    .actor_rollout_ref.actor)
    model = repro_model(HFModelConfig(path=model_dir, load_tokenizer=False), lora=False, kernels=actor.engine)
    assert (model.compile_layers, model.flash_attention) == ("aot_eager", "fa4")


def test_every_deepspeed_key_can_be_set_through_verl() -> None:
    """The ZeRO-3 sizes and the size-aware switch (missing from the hand-written section before) reach repro."""
    from verl.utils.config import omega_conf_to_dataclass

    p = "actor_rollout_ref.actor.deepspeed."
    actor = omega_conf_to_dataclass(_compose(f"{p}zero_stage=3", f"{p}stage3_prefetch_bucket_size=123",
                                             f"{p}stage3_param_persistence_threshold=45", f"{p}zero3_size_aware=true",
                                             f"{p}reduce_bucket_size=678").actor_rollout_ref.actor)
    ds = actor.engine.repro_deepspeed()
    assert (ds.zero_stage, ds.stage3_prefetch_bucket_size, ds.stage3_param_persistence_threshold,
            ds.zero3_size_aware, ds.reduce_bucket_size) == (3, 123, 45, True, 678)


@pytest.mark.parametrize("override,message", [
    ("+actor_rollout_ref.actor.deepspeed.zero_stagee=1",
     "deepspeed.zero_stagee is not a key of the DeepSpeed engine; choose from ["),
    ("actor_rollout_ref.actor.deepspeed.zero_stage=4", "deepspeed.zero_stage=4 is not valid; choose one of [1, 2, 3]"),
    ("actor_rollout_ref.actor.deepspeed.offload=gpu",
     "deepspeed.offload='gpu' is not valid; choose one of ['none', 'cpu', 'nvme', 'auto']"),
    ("actor_rollout_ref.actor.deepspeed.optimizer_offload=true",
     "deepspeed.optimizer_offload=True contradicts deepspeed.offload='none'"),
    ("actor_rollout_ref.actor.deepspeed.offload=nvme", "offload=nvme needs deepspeed.zero_stage=3"),
    ("actor_rollout_ref.actor.deepspeed.ulysses_sequence_parallel_size=0",
     "deepspeed.ulysses_sequence_parallel_size=0 must be an integer >= 1"),
    ("actor_rollout_ref.actor.deepspeed.stage3_prefetch_bucket_size=-1",
     "deepspeed.stage3_prefetch_bucket_size=-1 must be an integer >= 0"),
    ("actor_rollout_ref.actor.deepspeed.compile_layers=eager",
     "deepspeed.compile_layers='eager' is not valid; choose one of ['off', 'inductor', 'aot_eager']"),
    ("actor_rollout_ref.actor.deepspeed.flash_attention=fa3",
     "deepspeed.flash_attention='fa3' is not valid; choose one of ['torch', 'fa4']"),
    ("actor_rollout_ref.actor.optim.lr_scheduler_type=polynomial",
     "optim.lr_scheduler_type='polynomial' is not valid for the DeepSpeed engine; choose one of"),
])
def test_bad_key_is_one_clear_line(override: str, message: str) -> None:
    from verl.utils.config import omega_conf_to_dataclass

    with pytest.raises(Exception) as err:
        omega_conf_to_dataclass(_compose(override).actor_rollout_ref.actor)
    text = str(err.value)
    assert message in text, text


def test_env_knobs_mean_what_they_mean_in_repro(monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.integrations.verl.config import DeepSpeedEngineConfig
    from repro.integrations.verl.engine import DeepSpeedEngine

    monkeypatch.setenv("VERL_ENABLE_PARAM_OFFLOAD", "1")
    monkeypatch.setenv("VERL_DS_ZERO2_STEP_EACH_MICRO", "1")
    monkeypatch.setenv("VERL_DS_ZERO2_FP32_ACCUM_PATCH", "1")
    z3 = DeepSpeedEngine(None, DeepSpeedEngineConfig(zero_stage=3, offload="cpu"), optimizer_config=object())
    assert (z3.ds.param_offload, z3.ds.step_each_micro, z3.ds.fp32_grad_accum) == (True, True, True)
    assert z3.is_param_offload_enabled and z3.is_optimizer_offload_enabled
    # Stage-aware: below ZeRO-3 the param-offload knob offloads nothing but the optimizer states.
    z2 = DeepSpeedEngine(None, DeepSpeedEngineConfig(zero_stage=2, offload="cpu"), optimizer_config=object())
    assert not z2.is_param_offload_enabled and z2.is_optimizer_offload_enabled
    # An explicit key beats the environment, as in repro.
    off = DeepSpeedEngine(None, DeepSpeedEngineConfig(zero_stage=3, offload="cpu", param_offload=False),
                          optimizer_config=object())
    assert not off.is_param_offload_enabled
    monkeypatch.setenv("VERL_ENABLE_PARAM_OFFLOAD", "yes")
    with pytest.raises(ValueError, match="VERL_ENABLE_PARAM_OFFLOAD='yes' must be 0 or 1"):
        DeepSpeedEngineConfig(zero_stage=3)


def test_a_padded_micro_batch_on_an_engine_built_for_packed_rows_is_refused_by_name(model_dir) -> None:
    """repro's varlen path (CUDA) reads no attention mask: padded rows handed to it would attend across their padding.
    The refusal is the engine's own check, before any forward (run here with a forward that must not be reached)."""
    from repro.integrations.verl import model_io
    from tests.distributed.workers.helpers import make_step_batch
    from tests.verl_parity.engine.harness import SAMPLES, to_tensordict, verl_configs

    section, _ = verl_configs(model_dir, 2, "actor", remove_padding=False)
    micro = to_tensordict(make_step_batch(100, SAMPLES), section.engine, remove_padding=False)

    def unreachable(**kw):
        raise AssertionError("the forward ran")

    with pytest.raises(ValueError, match="a micro-batch with use_remove_padding=False reached a DeepSpeed engine built "
                                         r"with deepspeed.use_remove_padding=true \(FlashAttention over packed rows"):
        model_io.per_token(unreachable, micro, 1, lambda out, labels: (), packed_only=True)
    with pytest.raises(AssertionError, match="the forward ran"):  # the same micro-batch on a mask-reading engine
        model_io.per_token(unreachable, micro, 1, lambda out, labels: (), packed_only=False)
