"""The size-aware ZeRO-3 rule: Hugging Face's "auto" values, user values winning, DeepSpeed's otherwise."""

from __future__ import annotations

import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.config import ConfigFieldError, DeepSpeedConfig, OptimConfig
from repro.config.ds_config import build_ds_config
from repro.config.zero3 import (
    DEEPSPEED_PERSISTENCE_THRESHOLD,
    DEEPSPEED_PREFETCH_BUCKET_SIZE,
    DEEPSPEED_REDUCE_BUCKET_SIZE,
    SIZE_KEYS,
    ModelSize,
    hidden_size_of,
    model_size_for_path,
    model_size_of,
    zero3_sizes,
)
from tests.unit.config.plans import BENCH_PLAN

UNSET = dict.fromkeys(SIZE_KEYS)
DEEPSPEED = {"reduce_bucket_size": DEEPSPEED_REDUCE_BUCKET_SIZE,
             "stage3_prefetch_bucket_size": DEEPSPEED_PREFETCH_BUCKET_SIZE,
             "stage3_param_persistence_threshold": DEEPSPEED_PERSISTENCE_THRESHOLD}


def _transformers_auto(hidden: int) -> dict[str, int]:
    """What transformers' own DeepSpeed integration fills for ``"auto"`` at ZeRO-3."""
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    hf = HfTrainerDeepSpeedConfig({"train_batch_size": 2,
                                   "zero_optimization": {"stage": 3, **dict.fromkeys(SIZE_KEYS, "auto")}})
    model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=hidden))
    hf.trainer_config_finalize(types.SimpleNamespace(get_warmup_steps=lambda n: 0), model, 10)
    return {key: hf.config["zero_optimization"][key] for key in SIZE_KEYS}


def _zero(ds: DeepSpeedConfig, size: ModelSize | None) -> dict:
    return build_ds_config(ds, OptimConfig(), BENCH_PLAN, grad_clip=1.0, on_cuda=True, model_size=size)[
        "zero_optimization"]


@settings(max_examples=25, deadline=None)
@given(hidden=st.integers(1, 30_000))
def test_unset_zero3_sizes_equal_transformers_auto_values(hidden):
    sizes = zero3_sizes(UNSET, ModelSize(hidden))
    assert {k: s.value for k, s in sizes.items()} == _transformers_auto(hidden)
    assert {s.source for s in sizes.values()} == {"size-aware"}
    zero = _zero(DeepSpeedConfig(zero_stage=3, zero3_size_aware=True), ModelSize(hidden))
    assert {k: zero[k] for k in SIZE_KEYS} == _transformers_auto(hidden)


@settings(max_examples=30, deadline=None)
@given(
    user=st.fixed_dictionaries({
        "reduce_bucket_size": st.none() | st.integers(1, 10**10),
        "stage3_prefetch_bucket_size": st.none() | st.integers(0, 10**10),
        "stage3_param_persistence_threshold": st.none() | st.integers(0, 10**10),
    }),
    hidden=st.integers(1, 30_000),
    size_aware=st.booleans(),
)
def test_user_values_always_win(user, hidden, size_aware):
    ds = DeepSpeedConfig(zero_stage=3, zero3_size_aware=size_aware, **user)
    zero = _zero(ds, ModelSize(hidden))
    rule = _transformers_auto(hidden)
    for key in SIZE_KEYS:
        if user[key] is not None:
            assert zero[key] == user[key]
        else:
            assert zero[key] == (rule[key] if size_aware else DEEPSPEED[key])


def test_zero3_keeps_deepspeeds_values_by_default_as_measured():
    # results/bench/zero3_defaults.md: the size-aware sizes were no faster at the Qwen3-0.6B shape.
    assert DeepSpeedConfig().zero3_size_aware is False
    zero = _zero(DeepSpeedConfig(zero_stage=3), ModelSize(1024))
    assert {k: zero[k] for k in SIZE_KEYS} == DEEPSPEED
    sizes = zero3_sizes(UNSET, ModelSize(1024), enabled=False)
    assert "zero3_defaults.md" in sizes["reduce_bucket_size"].why


def test_without_a_model_size_or_switched_off_zero3_keeps_deepspeeds_values():
    for size, enabled in ((None, True), (ModelSize(1024), False)):
        sizes = zero3_sizes(UNSET, size, enabled)
        assert {k: s.value for k, s in sizes.items()} == DEEPSPEED
        assert {s.source for s in sizes.values()} == {"deepspeed"}
    assert "unknown" in zero3_sizes(UNSET, None)["reduce_bucket_size"].why


@pytest.mark.parametrize("stage", [1, 2])
def test_zero1_and_2_never_get_size_aware_sizes(stage):
    zero = _zero(DeepSpeedConfig(zero_stage=stage, zero3_size_aware=True), ModelSize(1024))
    assert zero["reduce_bucket_size"] == DEEPSPEED_REDUCE_BUCKET_SIZE
    assert not any(key.startswith("stage3_") for key in zero)
    assert _zero(DeepSpeedConfig(zero_stage=stage, reduce_bucket_size=7), None)["reduce_bucket_size"] == 7


def test_qwen3_0p6b_width_gives_a_2mb_bucket_instead_of_1gb():
    # h = 1024 (Qwen3-0.6B): the stage-3 gradient bucket is one bf16 buffer of reduce_bucket_size elements.
    sizes = zero3_sizes(UNSET, ModelSize(1024))
    assert sizes["reduce_bucket_size"].value * 2 == 2 * 1024 * 1024
    assert sizes["stage3_param_persistence_threshold"].value == 10_240


@pytest.mark.parametrize(
    ("key", "value"),
    [("reduce_bucket_size", 0), ("reduce_bucket_size", -1), ("stage3_prefetch_bucket_size", -1),
     ("stage3_param_persistence_threshold", -5), ("stage3_prefetch_bucket_size", True),
     ("reduce_bucket_size", 1.5)],
)
def test_invalid_sizes_name_the_key(key, value):
    with pytest.raises(ConfigFieldError, match=key):
        DeepSpeedConfig(**{key: value})


def test_zero_prefetch_and_persistence_are_valid_user_values():
    zero = _zero(DeepSpeedConfig(zero_stage=3, stage3_prefetch_bucket_size=0, stage3_param_persistence_threshold=0),
                 ModelSize(64))
    assert (zero["stage3_prefetch_bucket_size"], zero["stage3_param_persistence_threshold"]) == (0, 0)


def test_hidden_size_lookup_follows_transformers_order():
    assert hidden_size_of({"hidden_size": 8, "hidden_sizes": [99]}) == 8
    assert hidden_size_of({"hidden_sizes": [4, 16, 8]}) == 16
    assert hidden_size_of(types.SimpleNamespace(text_config=types.SimpleNamespace(hidden_size=12))) == 12
    assert hidden_size_of({"text_config": {"hidden_sizes": [3, 5]}}) == 5
    assert hidden_size_of({"vocab_size": 10}) is None


def test_model_size_from_a_module_and_from_its_folder_agree(tmp_path):
    from repro.data.tiny_model import build_model, toy_qwen3_config

    model = build_model(toy_qwen3_config())
    model.save_pretrained(tmp_path, safe_serialization=True)
    want = ModelSize(toy_qwen3_config().hidden_size)
    assert model_size_of(model) == want
    assert model_size_for_path(str(tmp_path)) == want
    assert model_size_for_path(str(tmp_path / "missing")) is None
    with pytest.raises(ValueError, match="hidden_size"):
        ModelSize(0)


@pytest.mark.parametrize(("size_aware", "prefetch"), [(True, None), (True, 123), (False, None)])
def test_plan_shows_each_zero3_size_and_the_json_the_engine_builds_from_the_loaded_model(tmp_path, size_aware,
                                                                                         prefetch):
    from repro.config.loader import load_config
    from repro.config.plan import effective_plan, plan_summary
    from repro.config.rules import plan_role_batch
    from repro.data.tiny_model import build_model, toy_qwen3_config
    from repro.workers.engine import load_hf_model

    build_model(toy_qwen3_config()).save_pretrained(tmp_path, safe_serialization=True)
    extra = [] if prefetch is None else [f"actor_rollout_ref.actor.deepspeed.stage3_prefetch_bucket_size={prefetch}"]
    cfg = load_config(["actor_rollout_ref.actor.deepspeed.zero_stage=3", f"actor_rollout_ref.model.path={tmp_path}",
                       f"actor_rollout_ref.actor.deepspeed.zero3_size_aware={size_aware}", *extra],
                      config_name="grpo_tiny")
    plan = effective_plan(cfg, on_cuda=False)
    actor = cfg.actor_rollout_ref.actor
    # What RoleEngine passes: the size of the model it loaded.
    engine_json = build_ds_config(actor.deepspeed, actor.optim, plan_role_batch(cfg, "actor"), grad_clip=actor.grad_clip,
                                  on_cuda=False, model_size=model_size_of(load_hf_model(cfg.actor_rollout_ref.model,
                                                                                        torch.float32)))
    assert plan["actor"]["deepspeed"] == engine_json
    h = toy_qwen3_config().hidden_size
    sizes = plan["actor"]["zero3_sizes"]
    if not size_aware:
        assert {k: s["value"] for k, s in sizes.items()} == DEEPSPEED
        assert {s["source"] for s in sizes.values()} == {"deepspeed"}
        return
    assert sizes["reduce_bucket_size"]["value"] == h * h and sizes["reduce_bucket_size"]["source"] == "size-aware"
    want_prefetch = ("user", 123) if prefetch else ("size-aware", int(0.9 * h * h))
    assert (sizes["stage3_prefetch_bucket_size"]["source"], sizes["stage3_prefetch_bucket_size"]["value"]) == want_prefetch
    line = next(x for x in plan_summary(plan) if x.startswith("actor:"))
    assert f"stage3_param_persistence_threshold={10 * h} (size-aware)" in line
