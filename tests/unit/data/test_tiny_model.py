"""Qwen3 models from configs: the tiny policy's size, save/load round trip, the toy and 0.6B shapes."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

from repro.data.tiny_model import (
    TOY_VOCAB,
    PolicyShape,
    build_model,
    load_model,
    num_parameters,
    qwen3_0p6b_config,
    save_model,
    tiny_config,
    toy_qwen3_config,
)
from repro.data.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def config():
    tok = build_tokenizer()
    return tiny_config(len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id)


def test_tiny_policy_is_a_qwen3_of_about_a_million_parameters(config):
    model = build_model(config)
    assert isinstance(model, Qwen3ForCausalLM)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (128, 4, 4)
    assert (config.num_key_value_heads, config.head_dim, config.intermediate_size) == (2, 32, 512)
    assert num_parameters(model) == 997_248
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_same_seed_same_weights_other_seed_other_weights(config):
    a, b, c = build_model(config, seed=1), build_model(config, seed=1), build_model(config, seed=2)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


def test_save_and_from_pretrained_round_trip_gives_identical_logits(config, tmp_path):
    model = build_model(config, seed=3).eval()
    save_model(model, tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[10, 20, 30, 40, 2]])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits)
    assert loaded.generation_config.eos_token_id == 2
    assert load_model(tmp_path).config.hidden_size == 128


def test_load_model_rejects_a_folder_without_config(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        load_model(tmp_path)


def test_qwen3_0p6b_shape_on_meta_device_has_its_published_size():
    cfg = qwen3_0p6b_config()
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        1024, 28, 16, 8)
    assert (cfg.head_dim, cfg.intermediate_size, cfg.vocab_size, cfg.tie_word_embeddings) == (
        128, 3072, 151936, True)
    model = build_model(cfg, device="meta")
    assert num_parameters(model) == 596_049_920


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hidden_size": 130}, "not divisible by num_attention_heads"),
        ({"num_key_value_heads": 3}, "not divisible by num_key_value_heads"),
        ({"num_hidden_layers": 0}, "must be >= 1"),
    ],
)
def test_bad_tiny_shapes_are_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PolicyShape(**kwargs)


def test_toy_qwen3_is_the_small_tied_model_and_overrides_apply():
    model = build_model(toy_qwen3_config())
    assert model.config.vocab_size == TOY_VOCAB and model.config.pad_token_id == 0
    assert num_parameters(model) == 20_672
    assert model.lm_head.weight is model.model.embed_tokens.weight
    untied = toy_qwen3_config(tie_word_embeddings=False, pad_token_id=None)
    assert (untied.tie_word_embeddings, untied.pad_token_id, untied.hidden_size) == (False, None, 32)
