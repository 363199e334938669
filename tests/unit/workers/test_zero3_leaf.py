"""ZeRO-3 leaf modules: the decoder layer class found from the model, and shown in the plan."""

from __future__ import annotations

import pytest
import torch

from repro.config.loader import load_config
from repro.config.plan import effective_plan, plan_summary
from repro.config.zero3 import leaf_names_for_path
from repro.data.tiny_model import toy_qwen3_config
from repro.workers.zero3_leaf import decoder_layer_classes, mark_zero3_leaves


def test_decoder_layer_class_is_found_from_the_model_and_marked():
    from deepspeed.utils import get_z3_leaf_modules
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM(toy_qwen3_config())
    assert [c.__name__ for c in decoder_layer_classes(model)] == ["Qwen3DecoderLayer"]
    assert mark_zero3_leaves(model) == ["Qwen3DecoderLayer"]
    assert len(get_z3_leaf_modules(model)) == toy_qwen3_config().num_hidden_layers
    assert decoder_layer_classes(torch.nn.Linear(2, 2)) == []


def test_leaf_names_from_a_model_folder_without_loading_weights(tmp_path):
    assert leaf_names_for_path("tiny") == ["Qwen3DecoderLayer"]
    toy_qwen3_config().save_pretrained(tmp_path)
    assert leaf_names_for_path(str(tmp_path)) == ["Qwen3DecoderLayer"]
    assert leaf_names_for_path(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("leaf", [True, False])
def test_plan_shows_the_zero3_leaf_choice(leaf):
    cfg = load_config(["actor_rollout_ref.actor.deepspeed.zero_stage=3",
                       f"actor_rollout_ref.actor.deepspeed.zero3_leaf_modules={leaf}"], config_name="grpo_tiny")
    plan = effective_plan(cfg, on_cuda=False)
    assert plan["actor"]["zero3_leaf_modules"] == (["Qwen3DecoderLayer"] if leaf else None)
    actor_line = next(line for line in plan_summary(plan) if line.startswith("actor:"))
    assert ("leaf modules Qwen3DecoderLayer" in actor_line) == leaf


def test_a_lora_actor_keeps_per_submodule_hooks_and_the_plan_says_so():
    # The engine asks the same rule (use_leaves with is_lora of its module); the stage-3 LoRA
    # backward with leaves fails on DeepSpeed 0.19.8 (tests/distributed/workers/test_lora.py).
    cfg = load_config(["actor_rollout_ref.actor.deepspeed.zero_stage=3", "actor_rollout_ref.model.lora_rank=8"],
                      config_name="grpo_tiny")
    assert effective_plan(cfg, on_cuda=False)["actor"]["zero3_leaf_modules"] is None
