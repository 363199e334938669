"""SFT warm start of the tiny policy: recipe validation, cache keys, and (slow) the real build."""

from __future__ import annotations

import json
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from repro.data import arith
from repro.data.sft import (
    ACCURACY_BAND,
    REPORT_NAME,
    SFTRecipe,
    cache_root,
    ensure_tiny_policy,
    greedy_accuracy,
    greedy_completions,
    read_report,
    sft_held_out,
    sft_training_sampler,
)
from repro.data.tiny_model import build_model, tiny_config
from repro.data.tokenizer import build_tokenizer


def test_recipe_key_changes_with_the_library_versions(monkeypatch):
    import transformers

    base = SFTRecipe().key("cpu")
    monkeypatch.setattr(torch, "__version__", torch.__version__ + ".other")
    other_torch = SFTRecipe().key("cpu")
    monkeypatch.setattr(transformers, "__version__", transformers.__version__ + ".other")
    assert len({base, other_torch, SFTRecipe().key("cpu")}) == 3


def test_recipe_key_changes_with_every_knob_and_with_the_device():
    base = SFTRecipe()
    keys = {base.key("cpu"), base.key("cuda"), SFTRecipe(seed=1).key("cpu"), SFTRecipe(threshold=0.3).key("cpu"),
            SFTRecipe(digits=(2, 2)).key("cpu"), SFTRecipe(lr=5e-4).key("cpu")}
    assert len(keys) == 6
    assert SFTRecipe(digits=[2, 1]).key("cpu") == base.key("cpu")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"threshold": 0.0}, "threshold"), ({"eval_every": 0}, "eval_every"), ({"lr": -1.0}, "lr"),
     ({"digits": (3,)}, "at least 2 operands")],
)
def test_bad_recipes_are_value_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SFTRecipe(**kwargs)


def test_greedy_completions_stop_at_eos_and_match_uncached_decoding():
    tok = build_tokenizer()
    model = build_model(tiny_config(len(tok), 0, 1, 2), seed=4).eval()
    prompts = [arith.question(p) for p in [(12, 3), (45, 6), (78, 9)]]
    got = greedy_completions(model, tok, prompts, max_new_tokens=6, device=torch.device("cpu"))
    ids = torch.tensor([tok(p)["input_ids"] for p in prompts])
    with torch.no_grad():
        for _ in range(6):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    for text, row in zip(got, ids[:, 12:].tolist(), strict=True):
        cut = row.index(2) if 2 in row else len(row)
        assert text == tok.decode(row[:cut], skip_special_tokens=True)


def test_rl_validation_is_disjoint_from_every_problem_the_default_sft_build_can_see():
    recipe = SFTRecipe()
    draw = sft_training_sampler(recipe)
    # Every problem the build can train on: max_steps full batches of the same stream it uses.
    sft_train = {draw() for _ in range(recipe.max_steps * recipe.batch_size)}
    sft_val = set(sft_held_out(recipe))
    assert len(sft_val) == recipe.n_val and not sft_val & sft_train
    for data_seed in range(4):
        rl_train, rl_val = arith.split_problems(data_seed, 2048, 256)
        assert len(set(rl_val)) == 256
        assert not set(rl_val) & (sft_train | sft_val)
        assert not set(rl_val) & set(rl_train)


@settings(max_examples=10, deadline=None)
@given(digits=st.lists(st.integers(1, 3), min_size=2, max_size=3).map(tuple), seed=st.integers(0, 10**6),
       data_seed=st.integers(0, 10**6))
def test_rl_validation_never_meets_sft_for_any_seeds_and_digits(digits, seed, data_seed):
    n_sft = min(20, arith.region_size(digits, "sft_val"))
    recipe = SFTRecipe(seed=seed, data_seed=data_seed, digits=digits, n_val=n_sft)
    draw = sft_training_sampler(recipe)
    sft_seen = {draw() for _ in range(500)} | set(sft_held_out(recipe))
    _, rl_val = arith.split_problems(data_seed, 1, min(30, arith.region_size(digits, "rl_val")), digits)
    assert not set(rl_val) & sft_seen


def test_sft_held_out_larger_than_its_region_is_a_value_error():
    with pytest.raises(ValueError, match=r"SFTRecipe.n_val=30 is more than the \d+ SFT held-out problems"):
        SFTRecipe(digits=(1, 1), n_val=30)


@pytest.mark.slow
def test_tiny_policy_lands_in_the_band_is_served_from_cache_and_rebuilds_bitwise_equal(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    device = torch.device("cpu")
    out = ensure_tiny_policy(tmp_path / "policy", device=device)
    report = json.loads((out / REPORT_NAME).read_text())
    assert report["accuracy_before"] < 0.05
    assert ACCURACY_BAND[0] <= report["accuracy_after"] <= ACCURACY_BAND[1]
    assert report["sft_steps"] % 10 == 0 and report["num_parameters"] == 997_248
    # Stopped at the first check that reached the threshold.
    assert all(acc < SFTRecipe().threshold for _, acc in report["history"][:-1])

    # The folder is a normal model path, and it holds the trained weights.
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    held_out = sft_held_out(SFTRecipe())
    assert greedy_accuracy(model, tok, held_out, device) == report["accuracy_after"]

    start = time.perf_counter()
    cached = ensure_tiny_policy(device=device)
    assert time.perf_counter() - start < 1.0
    assert read_report(cached) == report
    again = ensure_tiny_policy(tmp_path / "copy", device=device)
    assert (again / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


    # A second build on this machine is bitwise equal: the cache key may promise it. The second
    # build is the machine's own cache entry (REPRO_CACHE_DIR or ~/.cache/repro), built by another
    # process (a setup or an end-to-end job, which need it anyway) or, if absent, now: one SFT
    # build fewer per suite than a private rebuild, the same comparison.
    monkeypatch.undo()
    assert cache_root() != tmp_path / "cache"
    rebuilt = ensure_tiny_policy(device=device)
    assert (rebuilt / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    other = read_report(rebuilt)
    assert other["key"] == report["key"]
    for field in ("history", "final_loss", "sft_steps", "accuracy_after"):
        assert other[field] == report[field], field
