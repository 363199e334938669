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
