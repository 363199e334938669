"""SFT warm start of the tiny policy: recipe validation, cache keys, and (slow) the real build."""

from __future__ import annotations

import hashlib
import json
import shutil
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from repro.data import arith, tiny_fixture
from repro.data.sft import (
    ACCURACY_BAND,
    REPORT_NAME,
    SFTRecipe,
    ensure_tiny_policy,
    greedy_accuracy,
    greedy_completions,
    read_report,
    sft_held_out,
    sft_training_sampler,
    train_tiny_policy,
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


def test_the_tiny_policy_is_the_shipped_one_checked_file_by_file_and_served_without_training(tmp_path, monkeypatch):
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    start = time.perf_counter()
    out = ensure_tiny_policy(tmp_path / "policy", device=torch.device("cpu"))
    assert time.perf_counter() - start < 5.0, "copied, not trained (an SFT build takes minutes)"
    for name, digest in tiny_fixture.SHA256.items():
        if name != REPORT_NAME:
            assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest, name
    report = read_report(out)
    assert report["key"] == SFTRecipe().key("cpu") and report["source"].startswith("shipped")
    assert report["sft_steps"] == 240 and report["num_parameters"] == 997_248


def test_a_damaged_shipped_policy_is_an_error_naming_the_file_not_a_silent_rebuild(tmp_path, monkeypatch):
    damaged = tmp_path / "shipped"
    shutil.copytree(tiny_fixture.FOLDER, damaged)
    weights = bytearray((damaged / "model.safetensors").read_bytes())
    weights[-1] ^= 1
    (damaged / "model.safetensors").write_bytes(bytes(weights))
    monkeypatch.setattr(tiny_fixture, "FOLDER", damaged)
    monkeypatch.setenv("REPRO_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(RuntimeError, match=r"damaged or incomplete: \['model.safetensors'\]"):
        ensure_tiny_policy(device=torch.device("cpu"))


@pytest.mark.slow
def test_the_recipe_rebuilds_the_shipped_tiny_policy_byte_for_byte_where_the_cpu_kernels_are_the_same(tmp_path):
    here = tiny_fixture.kernel_paths()
    if here != tiny_fixture.BUILT_ON:
        # Another CPU model (or torch) runs other kernels: its SFT build is another policy by design
        # (results/tiny_policy/README.md), which is why the policy is shipped. Nothing to compare here.
        pytest.skip(f"this machine's kernel paths {here} are not those the shipped policy was built on")
    report = train_tiny_policy(SFTRecipe(), tmp_path, torch.device("cpu"))
    assert (tmp_path / "model.safetensors").read_bytes() == (tiny_fixture.FOLDER / "model.safetensors").read_bytes()
    shipped = json.loads((tiny_fixture.FOLDER / REPORT_NAME).read_text())
    for field in ("history", "final_loss", "sft_steps", "accuracy_after"):
        assert json.loads(json.dumps(report[field])) == shipped[field], field  # as the report file holds it
    # The model is what its report says: in the band, stopped at the first check over the threshold.
    assert report["accuracy_before"] < 0.05 and ACCURACY_BAND[0] <= report["accuracy_after"] <= ACCURACY_BAND[1]
    assert all(acc < SFTRecipe().threshold for _, acc in report["history"][:-1])
    model = AutoModelForCausalLM.from_pretrained(tiny_fixture.FOLDER).eval()
    tok = AutoTokenizer.from_pretrained(tiny_fixture.FOLDER)
    assert greedy_accuracy(model, tok, sft_held_out(SFTRecipe()), torch.device("cpu")) == report["accuracy_after"]
