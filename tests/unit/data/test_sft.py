"""SFT warm start of the tiny policy: recipe validation, cache keys, and (slow) the real build."""

from __future__ import annotations

import json
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from repro.data import arith
from repro.data.sft import (
    ACCURACY_BAND,
    REPORT_NAME,
    SFTRecipe,
    ensure_tiny_policy,
    greedy_accuracy,
    greedy_completions,
    read_report,
)
from repro.data.tiny_model import build_model, tiny_config
from repro.data.tokenizer import build_tokenizer


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


@pytest.mark.slow
def test_tiny_policy_lands_in_the_band_and_a_second_call_is_served_from_cache(tmp_path, monkeypatch):
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
    _, held_out = arith.split_problems(0, 1, SFTRecipe().n_val)
    assert greedy_accuracy(model, tok, held_out, device) == report["accuracy_after"]

    start = time.perf_counter()
    cached = ensure_tiny_policy(device=device)
    assert time.perf_counter() - start < 1.0
    assert read_report(cached) == report
    again = ensure_tiny_policy(tmp_path / "copy", device=device)
    assert (again / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
