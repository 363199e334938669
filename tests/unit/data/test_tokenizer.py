"""The character tokenizer: one id per character, lossless decoding, HF folder round trip."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoTokenizer

from repro.data.tokenizer import CHARACTERS, build_tokenizer, load_tokenizer, save_tokenizer

TOK = build_tokenizer()
ascii_text = st.text(alphabet=st.sampled_from(CHARACTERS), max_size=200)


@given(text=ascii_text)
def test_each_character_is_one_token_and_decoding_restores_the_text(text):
    ids = TOK(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert TOK.decode(ids) == text


def test_special_tokens_and_vocabulary():
    assert (TOK.pad_token, TOK.bos_token, TOK.eos_token, TOK.unk_token) == ("<pad>", "<bos>", "<eos>", "<unk>")
    assert (TOK.pad_token_id, TOK.bos_token_id, TOK.eos_token_id, TOK.unk_token_id) == (0, 1, 2, 3)
    assert len(TOK) == 4 + len(CHARACTERS) == 100
    assert TOK("Q: 1+2=? A:")["input_ids"] == TOK("Q: 1+2=? A:", add_special_tokens=False)["input_ids"]


def test_characters_outside_ascii_become_unk_and_eos_is_skipped_on_request():
    ids = TOK("é1", add_special_tokens=False)["input_ids"]
    assert ids[0] == TOK.unk_token_id
    assert TOK.decode(ids + [TOK.eos_token_id], skip_special_tokens=True) == "1"


def test_saved_folder_loads_with_auto_tokenizer_and_keeps_the_plain_template(tmp_path):
    save_tokenizer(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.get_vocab() == TOK.get_vocab()
    assert loaded.padding_side == "left"
    messages = [{"role": "user", "content": "Q: 23+4=? A:"}]
    assert loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == "Q: 23+4=? A:"
    text = "Q: 23+4=? A: #### 27"
    assert loaded.decode(loaded(text)["input_ids"]) == text
    assert load_tokenizer(tmp_path).eos_token_id == 2


def test_loading_from_a_missing_folder_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        load_tokenizer(tmp_path / "nope")


@pytest.fixture(scope="module")
def policy_folder(tmp_path_factory):
    """The tiny policy's folder layout: the tokenizer beside a Qwen3 config (AutoTokenizer reads both)."""
    from repro.data.tiny_model import tiny_config

    out = save_tokenizer(tmp_path_factory.mktemp("policy"))
    tiny_config(len(TOK), TOK.pad_token_id, TOK.bos_token_id, TOK.eos_token_id).save_pretrained(out)
    return out


@given(text=ascii_text)
def test_the_char_tokenizer_folder_loads_as_auto_tokenizer_loads_it(policy_folder, text):
    ours, auto = load_tokenizer(policy_folder), AutoTokenizer.from_pretrained(policy_folder)
    assert type(ours) is type(auto)
    assert ours.get_vocab() == auto.get_vocab()
    assert ours.special_tokens_map == auto.special_tokens_map
    assert (ours.padding_side, ours.chat_template) == (auto.padding_side, auto.chat_template)
    assert ours(text)["input_ids"] == auto(text)["input_ids"]
    assert ours(["1+2", text], padding=True)["attention_mask"] == auto(["1+2", text], padding=True)["attention_mask"]


def test_only_this_char_tokenizer_takes_the_direct_load(policy_folder, tmp_path):
    from repro.data.tokenizer import is_char_tokenizer

    assert is_char_tokenizer(policy_folder)
    other = tmp_path / "other"
    other.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (other / name).write_text((policy_folder / name).read_text())
    assert is_char_tokenizer(other)
    # Another vocabulary (a token renamed) is some other tokenizer: AutoTokenizer decides.
    (other / "tokenizer.json").write_text((policy_folder / "tokenizer.json").read_text().replace('"~"', '"~~"', 1))
    assert not is_char_tokenizer(other)
    assert not is_char_tokenizer(tmp_path / "missing")
    # A large tokenizer.json (a real model's, megabytes) is never parsed: its size settles it.
    (other / "tokenizer.json").write_text((policy_folder / "tokenizer.json").read_text() + " " * 70_000)
    assert not is_char_tokenizer(other)


def test_a_driver_loads_the_tiny_policy_without_importing_model_classes(policy_folder):
    """What a job's driver imports to resolve ``model.path=tiny`` and load its tokenizer: the model
    classes and AutoTokenizer's mapping stay out (~1.2 CPU s per job; the ranks import them)."""
    import subprocess
    import sys

    code = ("import sys\nimport repro.trainer, repro.data.sft\nfrom repro.data.tokenizer import load_tokenizer\n"
            f"load_tokenizer({str(policy_folder)!r})\n"
            "print([m for m in ('transformers.models.auto.modeling_auto', 'transformers.models.auto.tokenization_auto',"
            " 'transformers.models.qwen3.modeling_qwen3') if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
