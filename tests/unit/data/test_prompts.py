"""Prompt rendering and the resumable, seed-ordered prompt dataset."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro.data import arith
from repro.data.gsm8k import convert
from repro.data.prompts import PromptDataset, render_prompt
from repro.data.tokenizer import build_tokenizer

TOK = build_tokenizer()
# The GSM8K sample checked in for tests (fixtures/gsm8k/README.md says where it comes from).
FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "gsm8k"


class _NoTemplate:
    chat_template = None


def test_render_uses_the_chat_template_or_joins_contents():
    msgs = [{"role": "system", "content": "S. "}, {"role": "user", "content": "Q: 1+2=? A:"}]
    assert render_prompt(TOK, msgs) == "S. Q: 1+2=? A:"
    assert render_prompt(_NoTemplate(), msgs) == "S. Q: 1+2=? A:"
    with pytest.raises(ValueError, match="no messages"):
        render_prompt(TOK, [])


@pytest.fixture(scope="module")
def arith_files(tmp_path_factory):
    return arith.write_parquet(tmp_path_factory.mktemp("arith"), seed=0, n_train=50, n_val=10)


def test_items_carry_ids_reward_source_and_truth(arith_files):
    ds = PromptDataset(arith_files[1], TOK, max_prompt_length=32)
    assert len(ds) == 10
    item = ds[0]
    assert TOK.decode(item["input_ids"]) == item["text"] == arith.question(arith.split_problems(0, 50, 10)[1][0])
    assert item["data_source"] == "repro/arith"
    assert item["ground_truth"] == str(sum(map(int, item["text"][3:-5].split("+"))))
    assert item["extra_info"]["split"] == "val"


def test_several_files_are_concatenated_in_order(arith_files):
    ds = PromptDataset(list(arith_files), TOK, max_prompt_length=32, shuffle=False)
    assert len(ds) == 60
    assert [it["index"] for it in ds.items] == list(range(60))
    assert ds[50]["extra_info"]["split"] == "val"


def test_overlong_prompts_are_dropped_rejected_or_truncated(tmp_path):
    paths = convert(FIXTURES, tmp_path)
    lengths = [len(TOK(it["text"])["input_ids"])
               for it in PromptDataset(paths["test"], TOK, max_prompt_length=10_000).items]
    limit = sorted(lengths)[len(lengths) // 2]
    kept = PromptDataset(paths["test"], TOK, max_prompt_length=limit, filter_overlong_prompts=True)
    assert len(kept) == sum(n <= limit for n in lengths) and kept.num_dropped == sum(n > limit for n in lengths)
    with pytest.raises(ValueError, match=rf"row \d+: prompt has \d+ tokens > max_prompt_length={limit}"):
        PromptDataset(paths["test"], TOK, max_prompt_length=limit)
    left = PromptDataset(paths["test"], TOK, max_prompt_length=limit, truncation="left", shuffle=False)
    right = PromptDataset(paths["test"], TOK, max_prompt_length=limit, truncation="right", shuffle=False)
    long_one = next(i for i, n in enumerate(lengths) if n > limit)
    full = TOK(left[long_one]["text"])["input_ids"]
    assert left[long_one]["input_ids"] == full[-limit:]
    assert right[long_one]["input_ids"] == full[:limit]
    with pytest.raises(ValueError, match="truncation='top'"):
        PromptDataset(paths["test"], TOK, max_prompt_length=limit, truncation="top")


def test_missing_file_and_everything_filtered_are_value_errors(arith_files, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        PromptDataset(tmp_path / "x.parquet", TOK, max_prompt_length=8)
    with pytest.raises(ValueError, match="no prompts left"):
        PromptDataset(arith_files[1], TOK, max_prompt_length=3, filter_overlong_prompts=True)


def test_each_epoch_is_a_seeded_permutation(arith_files):
    ds = PromptDataset(arith_files[0], TOK, max_prompt_length=32, seed=5)
    again = PromptDataset(arith_files[0], TOK, max_prompt_length=32, seed=5)
    other = PromptDataset(arith_files[0], TOK, max_prompt_length=32, seed=6)
    assert ds.order(0) == again.order(0) != other.order(0)
    assert ds.order(0) != ds.order(1)
    assert sorted(ds.order(3)) == list(range(50))
    plain = PromptDataset(arith_files[0], TOK, max_prompt_length=32, shuffle=False)
    assert plain.order(7) == list(range(50))


@pytest.fixture(scope="module")
def train_ds(arith_files):
    return PromptDataset(arith_files[0], TOK, max_prompt_length=32, seed=1)


def _fresh(ds: PromptDataset) -> PromptDataset:
    clone = copy.copy(ds)
    clone.epoch, clone.position = 0, 0
    return clone


@given(batch=st.integers(1, 50), stop_after=st.integers(0, 12), more=st.integers(1, 6))
def test_resuming_from_state_dict_continues_the_same_batches(train_ds, batch, stop_after, more):
    ref = _fresh(train_ds)
    seen = [[it["index"] for it in ref.next_batch(batch)] for _ in range(stop_after + more)]
    first = _fresh(train_ds)
    for _ in range(stop_after):
        first.next_batch(batch)
    resumed = _fresh(train_ds)
    resumed.load_state_dict(first.state_dict())
    assert [[it["index"] for it in resumed.next_batch(batch)] for _ in range(more)] == seen[stop_after:]


def test_batches_drop_the_short_tail_of_an_epoch(arith_files):
    ds = PromptDataset(arith_files[0], TOK, max_prompt_length=32, seed=2)
    assert ds.steps_per_epoch(16) == 3
    epoch0 = [it["index"] for _ in range(3) for it in ds.next_batch(16)]
    assert len(set(epoch0)) == 48
    ds.next_batch(16)
    assert ds.state_dict()["epoch"] == 1 and ds.state_dict()["position"] == 16


def test_resume_rejects_a_state_of_another_dataset(arith_files):
    ds = PromptDataset(arith_files[0], TOK, max_prompt_length=32, seed=1)
    with pytest.raises(ValueError, match="seed=2"):
        ds.load_state_dict({"epoch": 0, "position": 0, "seed": 2, "num_items": 50})
    with pytest.raises(ValueError, match="num_items=10"):
        ds.load_state_dict(PromptDataset(arith_files[1], TOK, max_prompt_length=32, seed=1).state_dict())
    with pytest.raises(ValueError, match="between 1 and the 50 prompts"):
        ds.next_batch(51)
