"""verl's DeepSpeed engine section is derived from repro's DeepSpeedConfig: a key on one side only fails here.

Core suite, no verl: the keys come from ``repro.integrations.verl.engine_keys`` (which needs no
verl), the verl-side class is read from its source. ``tests/verl_parity/engine/test_engine_config.py``
checks the built class in verl's environment.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import pytest
from omegaconf import OmegaConf

from repro.config import ConfigFieldError, DeepSpeedConfig, LayerKernels, OptimConfig
from repro.integrations.verl import engine_keys as K

VERL = pathlib.Path(K.__file__).parent
HYDRA = VERL / "hydra_config"
OWN_KEYS = {"strategy", "ulysses_sequence_parallel_size", "dtype"}
"""The only keys the engine section has beyond repro's DeepSpeedConfig: verl's engine keys that the trainer sets."""


def load(path: pathlib.Path) -> dict:
    """A yaml as Hydra reads it (OmegaConf's loader: ``1e-6`` is a float), interpolations unresolved."""
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


def drift(yaml_keys: dict, want: dict) -> list[str]:
    """Each difference between the yaml's keys and the dataclasses', one line each."""
    problems = [f"{k}: in the dataclasses, not in the yaml" for k in want if k not in yaml_keys]
    problems += [f"{k}: in the yaml, not in the dataclasses" for k in yaml_keys if k not in want]
    problems += [f"{k}: yaml says {yaml_keys[k]!r}, the dataclass default is {want[k]!r}"
                 for k in want if k in yaml_keys and yaml_keys[k] != want[k]]
    return problems


def own_fields(cls_name: str, source: str) -> set[str]:
    """Fields a class body declares itself (annotated names), read from its module's source."""
    (cls,) = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls_name]
    return {s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}


def test_every_deepspeed_key_and_layer_key_is_an_engine_key_and_the_engine_adds_only_verls_three() -> None:
    repro = {f.name: f.default for f in dataclasses.fields(DeepSpeedConfig)}
    # compile_layers, flash_attention: repro's model-section keys, engine keys in verl (its model section is verl's)
    layer = {f.name: f.default for f in dataclasses.fields(LayerKernels)}
    engine = {f.name: f.default for f in dataclasses.fields(K.DeepSpeedEngineKeys)}
    assert {k: engine[k] for k in repro} == repro  # inherited: same names, same defaults
    assert {k: engine[k] for k in layer} == layer
    assert set(engine) - set(repro) - set(layer) == OWN_KEYS, (
        "a key of verl's engine section that repro's DeepSpeedConfig lacks: define it in repro.config.DeepSpeedConfig, "
        "or (a verl engine key) add it to OWN_KEYS here")
    assert own_fields("DeepSpeedEngineKeys", pathlib.Path(K.__file__).read_text()) == OWN_KEYS
    # verl's class declares no key: all come from DeepSpeedEngineKeys and verl's EngineConfig.
    assert own_fields("DeepSpeedEngineConfig", (VERL / "config.py").read_text()) == set(), (
        "declare engine keys in repro.config.DeepSpeedConfig (or DeepSpeedEngineKeys), not in DeepSpeedEngineConfig")


def test_engine_yaml_has_every_key_with_its_default_and_nothing_else() -> None:
    loaded = load(K.ENGINE_YAML)
    assert loaded.pop("_target_") == K.TARGET
    problems = drift(loaded, K.engine_keys())
    assert not problems, "engine/deepspeed.yaml differs from the dataclasses (rewrite it: python -m " \
                         "repro.integrations.verl.engine_keys):\n" + "\n".join(problems)


def test_engine_yaml_is_the_generated_text() -> None:
    assert K.ENGINE_YAML.read_text() == K.render_engine_yaml(), (
        "engine/deepspeed.yaml is generated: run python -m repro.integrations.verl.engine_keys")


def test_role_yamls_set_only_engine_keys_and_fall_back_to_their_defaults() -> None:
    keys = K.engine_keys()
    for name in ("actor/deepspeed_actor.yaml", "critic/deepspeed_critic.yaml", "ref/deepspeed_ref.yaml"):
        section = load(HYDRA / name).get("deepspeed", {})
        assert set(section) <= set(keys), (name, set(section) - set(keys))
        for key, value in section.items():
            if isinstance(value, str) and value.startswith("${oc.select:"):  # ${oc.select:<key>,<fallback>}
                fallback = OmegaConf.create({"v": value}).v  # resolved where <key> is absent: the fallback
                assert fallback == keys[key], f"{name}: deepspeed.{key} falls back to {fallback!r}, not {keys[key]!r}"


def test_optim_yaml_defaults_are_repros() -> None:
    """verl's optim section for the engine restates repro's OptimConfig defaults under verl's names."""
    optim = load(HYDRA / "optim" / "deepspeed.yaml")
    want = OptimConfig()
    renamed = {"lr_scheduler_type": "warmup_style"}
    for key, value in optim.items():
        name = renamed.get(key, key)
        if hasattr(want, name):
            assert value == getattr(want, name), (key, value, getattr(want, name))


def test_the_check_fails_on_a_key_on_one_side_only() -> None:
    """The drift checks can fail: a key added to the dataclass or to the yaml alone is named."""
    keys = K.engine_keys()
    yaml_keys = dict(keys)
    assert drift(yaml_keys, {**keys, "zero4_magic": 1}) == ["zero4_magic: in the dataclasses, not in the yaml"]
    assert drift({**yaml_keys, "zero4_magic": 1}, keys) == ["zero4_magic: in the yaml, not in the dataclasses"]
    assert drift({**yaml_keys, "zero_stage": 3}, keys) == ["zero_stage: yaml says 3, the dataclass default is 2"]
    body = "class DeepSpeedEngineConfig(DeepSpeedEngineKeys, EngineConfig):\n    zero4_magic: int = 1\n"
    assert own_fields("DeepSpeedEngineConfig", body) == {"zero4_magic"}


def test_engine_keys_pass_every_deepspeed_key_to_repro() -> None:
    """The three keys verl could not set before (stage3 sizes, size-aware) reach repro's section."""
    section = K.DeepSpeedEngineKeys(zero_stage=3, stage3_prefetch_bucket_size=123,
                                    stage3_param_persistence_threshold=45, zero3_size_aware=True, dtype="bf16")
    ds = section.repro_deepspeed()
    assert type(ds) is DeepSpeedConfig
    assert (ds.stage3_prefetch_bucket_size, ds.stage3_param_persistence_threshold, ds.zero3_size_aware) == (123, 45, True)
    assert ds.model_dtype == "bfloat16"  # verl's dtype fills model_dtype=auto


@pytest.mark.parametrize("values,message", [
    ({"zero_stage": 4}, "deepspeed.zero_stage=4 is not valid; choose one of [1, 2, 3]"),
    ({"stage3_prefetch_bucket_size": -1}, "deepspeed.stage3_prefetch_bucket_size=-1 must be an integer >= 0"),
    ({"ulysses_sequence_parallel_size": 0}, "deepspeed.ulysses_sequence_parallel_size=0 must be an integer >= 1"),
    ({"strategy": "fsdp"}, "deepspeed.strategy='fsdp' is not valid for this engine; choose one of ['deepspeed']"),
    ({"dtype": "bf16", "model_dtype": "float32"}, "deepspeed.dtype='bf16' contradicts deepspeed.model_dtype='float32'"),
    ({"offload": "nvme"}, "deepspeed.offload=nvme needs deepspeed.zero_stage=3"),
    ({"compile_layers": "eager"}, "deepspeed.compile_layers='eager' is not valid; choose one of ['off', 'inductor', "
                                  "'aot_eager']"),
    ({"flash_attention": "fa3"}, "deepspeed.flash_attention='fa3' is not valid; choose one of ['torch', 'fa4']"),
    ({"compile_layers": "inductor", "zero_stage": 3},
     "deepspeed.compile_layers='inductor' with deepspeed.zero_stage=3: zero_stage=3 is not valid; choose 0, 1 or 2"),
])
def test_engine_keys_are_validated_by_repros_checks_named_as_verls_keys(values: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        K.DeepSpeedEngineKeys(**values)
    assert message in str(err.value) and not isinstance(err.value, ConfigFieldError)


def test_seed_section_yaml_is_generated_with_every_repro_key_unset() -> None:
    """``critic.deepspeed_config`` (the seed PR's spelling) lists repro's DeepSpeed keys, each null, and nothing else."""
    assert K.SEED_YAML.read_text() == K.render_seed_yaml(), (
        "engine/deepspeed_config.yaml is generated: run python -m repro.integrations.verl.engine_keys")
    assert load(K.SEED_YAML) == {f.name: None for f in dataclasses.fields(DeepSpeedConfig)}


def test_seed_keys_move_into_the_engine_section_and_a_contradiction_names_both() -> None:
    engine = K.DeepSpeedEngineKeys()
    seed = {"critic.deepspeed_config.zero_stage": 3, "critic.deepspeed_config.offload": None}
    assert K.fold_seed_keys(engine, seed) == {"zero_stage": 3}  # null: unset, so not moved
    assert K.fold_seed_keys(K.DeepSpeedEngineKeys(zero_stage=3), seed) == {"zero_stage": 3}  # both agree
    with pytest.raises(ValueError, match=r"critic.deepspeed_config.zero_stage=3 contradicts deepspeed.zero_stage=1"):
        K.fold_seed_keys(K.DeepSpeedEngineKeys(zero_stage=1), seed)
