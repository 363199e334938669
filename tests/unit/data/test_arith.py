"""The synthetic arithmetic task: verl schema, determinism, held-out split, difficulty knobs."""

from __future__ import annotations

import re

import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro.data import arith
from repro.data.__main__ import main
from repro.rewards import get_reward_fn

_Q = re.compile(r"^Q: (\d+(?:\+\d+)+)=\? A:$")


def test_prompt_and_answer_text():
    assert arith.question((23, 4)) == "Q: 23+4=? A:"
    assert arith.answer((23, 4)) == " #### 27"
    row = arith.make_row((23, 4), "train", 5)
    assert row == {
        "data_source": "repro/arith",
        "prompt": [{"role": "user", "content": "Q: 23+4=? A:"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "27"},
        "extra_info": {"split": "train", "index": 5, "answer": " #### 27", "question": "Q: 23+4=? A:"},
    }


def test_same_seed_same_problems_other_seed_other_problems():
    a = arith.split_problems(3, 100, 50)
    assert a == arith.split_problems(3, 100, 50)
    assert a != arith.split_problems(4, 100, 50)


@given(
    digits=st.lists(st.integers(1, 4), min_size=2, max_size=4).map(tuple),
    seed=st.integers(0, 1000),
    n_val=st.integers(1, 40),
)
def test_operands_have_the_requested_digits_and_validation_is_held_out(digits, seed, n_val):
    n_val = min(n_val, arith.region_size(digits, "rl_val"))
    train, val = arith.split_problems(seed, 60, n_val, digits)
    assert len(train) == 60 and len(val) == n_val
    assert len(set(val)) == n_val
    assert not set(train) & set(val)
    for p in train + val:
        assert len(p) == len(digits)
        assert [len(str(x)) for x in p] == list(digits)
    assert {arith.region(p) for p in val} == {"rl_val"}
    assert {arith.region(p) for p in train} == {"train"}


def test_parquet_rows_are_solvable_by_the_registered_reward(tmp_path):
    train_path, val_path = arith.write_parquet(tmp_path, seed=0, n_train=64, n_val=32, digits=(2, 2, 1))
    for path, split, n in ((train_path, "train", 64), (val_path, "val", 32)):
        rows = pq.read_table(path).to_pylist()
        assert len(rows) == n
        for i, row in enumerate(rows):
            q = row["prompt"][0]["content"]
            operands = [int(x) for x in _Q.match(q).group(1).split("+")]
            assert len(operands) == 3
            assert row["reward_model"]["ground_truth"] == str(sum(operands))
            assert row["extra_info"]["split"] == split and row["extra_info"]["index"] == i
            reward = get_reward_fn(row["data_source"])
            assert reward(row["extra_info"]["answer"], row["reward_model"]["ground_truth"]) == 1.0


def test_ensure_reuses_files_of_the_same_spec_and_rewrites_for_another(tmp_path):
    train, val = arith.ensure_arith_parquet(tmp_path, seed=1, n_train=20, n_val=10)
    stamp = (train.stat().st_mtime_ns, val.stat().st_mtime_ns)
    assert arith.ensure_arith_parquet(tmp_path, seed=1, n_train=20, n_val=10) == (train, val)
    assert (train.stat().st_mtime_ns, val.stat().st_mtime_ns) == stamp
    arith.ensure_arith_parquet(tmp_path, seed=2, n_train=20, n_val=10)
    again = pq.read_table(val).to_pylist()
    assert [r["prompt"] for r in again] == [arith.make_row(p, "val", 0)["prompt"]
                                             for p in arith.split_problems(2, 20, 10)[1]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"digits": (2,)}, "at least 2 operands"),
        ({"digits": (0, 1)}, r"1\.\.9 digits"),
        ({"n_val": 60, "digits": (1, 1)}, r"arith n_val=60 is more than the \d+ problems of the 'rl_val' region"),
        ({"n_train": 0}, "must be >= 1"),
    ],
)
def test_bad_knobs_are_value_errors(kwargs, message):
    args = {"seed": 0, "n_train": 10, "n_val": 5, "digits": (2, 1)} | kwargs
    with pytest.raises(ValueError, match=message):
        arith.split_problems(**args)


def test_space_size_counts_distinct_problems():
    assert arith.space_size((2, 1)) == 900


def test_regions_partition_the_space_with_room_for_the_default_validation_sets():
    sizes = {name: arith.region_size((2, 1), name) for name in arith.REGIONS}
    assert sum(sizes.values()) == 900
    assert sizes["rl_val"] >= 256 and sizes["sft_val"] >= 200
    assert arith.space_size((1, 1, 1)) == 1000


def test_cli_writes_train_and_val(tmp_path, capsys):
    assert main(["arith", "--out", str(tmp_path), "--seed", "7", "--n-train", "30", "--n-val", "8",
                 "--digits", "3,2"]) == 0
    rows = pq.read_table(tmp_path / "val.parquet").to_pylist()
    assert len(rows) == 8
    assert all(_Q.match(r["prompt"][0]["content"]) for r in rows)
    assert main(["arith", "--out", str(tmp_path), "--n-val", "5000"]) == 2
