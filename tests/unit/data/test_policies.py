"""Built-in policies: names a run may give as ``model.path``, their recipes, and where they build.

The 0.6B policy is built on a GPU (``results/seed_scale/``); here its recipe gives Qwen3-0.6B's
architecture and size without allocating it, and its pieces (a vocabulary larger than the
tokenizer's, an explicit head_dim, bf16 weights, warm-up) are built for real on a scaled-down shape.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from repro.data.policies import NAMES, built_in, is_built_in
from repro.data.sft import SFTRecipe, train_tiny_policy
from repro.data.tiny_model import PolicyShape, build_model, num_parameters, qwen3_0p6b_config, tiny_config
from repro.data.tokenizer import build_tokenizer
from repro.run.preflight import InputError, check_built_in


def test_the_built_in_names_and_only_those_are_built_in():
    assert set(NAMES) == {"tiny", "qwen3-0.6b-arith"}
    assert is_built_in("tiny") and is_built_in("qwen3-0.6b-arith")
    assert not is_built_in("/models/tiny") and not is_built_in(None)
    with pytest.raises(ValueError, match=r"'nope' is not a built-in policy; choose one of \['qwen3-0.6b-arith', 'tiny'\]"):
        built_in("nope")


def test_the_0p6b_policy_has_qwen3_0p6b_architecture_and_size():
    tok = build_tokenizer()
    recipe = built_in("qwen3-0.6b-arith").recipe
    cfg = tiny_config(len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, recipe.shape)
    ref = qwen3_0p6b_config()
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size", "vocab_size", "tie_word_embeddings"):
        assert getattr(cfg, key) == getattr(ref, key), key
    assert num_parameters(build_model(cfg, device="meta")) == 596_049_920
    assert (cfg.eos_token_id, cfg.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)  # the char tokenizer's ids


def test_the_tiny_policy_keeps_its_key_and_the_0p6b_one_gets_its_own():
    tiny = built_in("tiny")
    # Fields added after recipe version 2 stay out of the tiny recipe's record, so cached copies stay valid.
    assert set(SFTRecipe().as_dict()) == {"seed", "data_seed", "digits", "n_val", "batch_size", "lr", "threshold",
                                          "eval_every", "max_steps", "grad_clip", "shape"}
    assert tiny.recipe.key("cpu") == SFTRecipe().key("cpu")
    big = built_in("qwen3-0.6b-arith").recipe
    assert big.key("cuda") != tiny.recipe.key("cuda")
    assert big.as_dict()["dtype"] == "bfloat16" and big.as_dict()["shape"]["vocab_size"] == 151936


def test_a_vocabulary_smaller_than_the_tokenizer_is_refused():
    tok = build_tokenizer()
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        tiny_config(len(tok), 0, 1, 2, PolicyShape(vocab_size=len(tok) - 1))


def test_a_gpu_built_policy_without_a_gpu_or_a_cached_copy_is_one_input_error(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("repro.run.preflight.visible_gpus", lambda: 0)
    with pytest.raises(InputError, match=r"actor_rollout_ref.model.path=qwen3-0.6b-arith is built on a CUDA GPU "
                                         r"and none is visible here: build it on a GPU machine \(python -m repro.data "
                                         r"policy qwen3-0.6b-arith\)"):
        check_built_in("actor_rollout_ref.model.path", "qwen3-0.6b-arith")


@pytest.mark.slow
def test_the_0p6b_recipe_on_a_scaled_down_shape_builds_a_bf16_policy_with_the_wide_vocabulary(tmp_path):
    # The 0.6B recipe's knobs on a shape a CPU trains in a minute: vocabulary 4096 (the char tokenizer
    # uses 19 ids), explicit head_dim, bf16 weights and AdamW state, warm-up, betas, no weight decay.
    shape = PolicyShape(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=128, head_dim=32, vocab_size=4096, max_position_embeddings=64)
    recipe = SFTRecipe(shape=shape, batch_size=64, lr=3e-3, warmup_steps=10, betas=(0.9, 0.95), weight_decay=0.0,
                       dtype="bfloat16", threshold=0.04, n_val=50, max_steps=600)
    report = train_tiny_policy(recipe, tmp_path, torch.device("cpu"))
    assert report["accuracy_after"] >= 0.04 > report["accuracy_before"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["vocab_size"], config["head_dim"], config["dtype"]) == (4096, 32, "bfloat16")
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        emb = f.get_tensor("model.embed_tokens.weight")
    assert emb.dtype == torch.bfloat16 and emb.shape == (4096, 64)


def test_a_build_under_other_library_versions_is_named_when_a_run_must_build_again(tmp_path, monkeypatch):
    # The fifth 4-GPU lease rebuilt the 0.6B policy inside a run, silently: its build had run under the image's
    # transformers, the run under vLLM's, and the versions are in the cache key (results/4gpu/README.md).
    from repro.data.sft import REPORT_NAME, library_versions
    from repro.run.paths import _other_builds

    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path))
    policy = built_in("qwen3-0.6b-arith")
    here = library_versions()
    recipe = json.loads(json.dumps(policy.recipe.as_dict()))

    def cached_build(name: str, **report) -> None:
        folder = policy.cached().parent / name
        folder.mkdir(parents=True)
        (folder / REPORT_NAME).write_text(json.dumps({"recipe": recipe, "device": "cuda", "libraries": here, **report}))

    assert policy.other_library_builds() == {} and _other_builds(policy) == ""
    cached_build("a13c", libraries={**here, "transformers": "5.17.0-other"})
    cached_build("b000", recipe={**recipe, "seed": -1}, libraries={**here, "transformers": "5.17.0-other"})  # another recipe
    cached_build("c000", device="cpu", libraries={**here, "transformers": "5.17.0-other"})  # another device type
    assert policy.other_library_builds() == {"a13c": {"transformers": "5.17.0-other"}}
    said = _other_builds(policy)
    assert "(a13c: transformers 5.17.0-other)" in said and said.endswith(f"not usable with transformers {here['transformers']} here")
