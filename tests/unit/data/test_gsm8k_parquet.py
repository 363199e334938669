"""GSM8K jsonl -> parquet: verl's schema, and bad input reported by file and line, atomically."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from repro.data.__main__ import main
from repro.data.gsm8k import INSTRUCTION, convert, ground_truth_of
from repro.rewards.gsm8k import compute_score

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "gsm8k"


@pytest.fixture
def jsonl_dir(tmp_path: Path) -> Path:
    d = tmp_path / "jsonl"
    d.mkdir()
    for name in ("train.jsonl", "test.jsonl"):
        shutil.copy(FIXTURES / name, d / name)
    return d


def test_fixture_slices_convert_to_verl_rows(jsonl_dir, tmp_path):
    paths = convert(jsonl_dir, tmp_path / "out")
    assert sorted(paths) == ["test", "train"]
    for split, path in paths.items():
        table = pq.read_table(path)
        assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
        rows = table.to_pylist()
        source = [json.loads(x) for x in (jsonl_dir / f"{split}.jsonl").read_text().splitlines()]
        assert len(rows) == len(source) == 64
        first = source[0]
        assert rows[0] == {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": first["question"] + " " + INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": first["answer"].split("#### ")[-1]},
            "extra_info": {"split": split, "index": 0, "answer": first["answer"], "question": first["question"]},
        }
        assert [r["extra_info"]["index"] for r in rows] == list(range(64))
        # The full worked answer scores 1 against the stored ground truth.
        assert all(compute_score(r["extra_info"]["answer"], r["reward_model"]["ground_truth"]) == 1.0 for r in rows)


def test_instruction_is_verls_wording():
    assert INSTRUCTION == 'Let\'s think step by step and output the final answer after "####".'


def test_ground_truth_drops_thousands_separators_and_keeps_sign_and_decimals():
    assert ground_truth_of("so it is 1,234,567\n#### 1,234,567") == "1234567"
    assert ground_truth_of("#### -3.5") == "-3.5"
    assert ground_truth_of("no final marker 12") is None


def _write(d: Path, name: str, lines: list[str]) -> None:
    (d / name).write_text("\n".join(lines) + "\n")


GOOD = json.dumps({"question": "What is 1+1?", "answer": "1+1=2\n#### 2"})


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", r"test\.jsonl:3: not valid JSON"),
        (json.dumps({"question": "q"}), r"test\.jsonl:3: missing string field 'answer'"),
        (json.dumps({"question": "q", "answer": "just 4"}), r"test\.jsonl:3: answer has no '#### <number>'"),
        (json.dumps([1, 2]), r"test\.jsonl:3: expected a JSON object"),
    ],
)
def test_bad_line_fails_with_file_and_line_and_writes_nothing(tmp_path, bad_line, message):
    _write(tmp_path, "train.jsonl", [GOOD, GOOD])
    _write(tmp_path, "test.jsonl", [GOOD, GOOD, bad_line, GOOD])
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=message):
        convert(tmp_path, out)
    # The good train split is not written either: no half-done output directory.
    assert not out.exists() or list(out.iterdir()) == []


def test_missing_split_file_names_the_path(tmp_path):
    _write(tmp_path, "train.jsonl", [GOOD])
    with pytest.raises(ValueError, match=r"test\.jsonl does not exist"):
        convert(tmp_path, tmp_path / "out")


def test_unknown_split_lists_valid_splits(tmp_path):
    with pytest.raises(ValueError, match=r"'dev'.*\['train', 'test'\]"):
        convert(tmp_path, tmp_path / "out", splits=("dev",))


def test_failed_rewrite_keeps_the_previous_parquet_and_leaves_no_temp_files(tmp_path):
    _write(tmp_path, "train.jsonl", [GOOD, GOOD])
    _write(tmp_path, "test.jsonl", [GOOD])
    out = tmp_path / "out"
    convert(tmp_path, out)
    before = (out / "train.parquet").read_bytes()
    _write(tmp_path, "train.jsonl", [GOOD, "{oops"])
    with pytest.raises(ValueError, match=r"train\.jsonl:2"):
        convert(tmp_path, out)
    assert (out / "train.parquet").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet", "train.parquet"]


def test_cli_converts_and_reports_row_counts(jsonl_dir, tmp_path, capsys):
    assert main(["gsm8k", "--jsonl-dir", str(jsonl_dir), "--out", str(tmp_path / "o")]) == 0
    printed = capsys.readouterr().out
    assert "train: 64 rows" in printed and "test: 64 rows" in printed
    assert pq.read_metadata(tmp_path / "o" / "test.parquet").num_rows == 64


def test_cli_reports_bad_input_with_exit_code_2(tmp_path, capsys):
    assert main(["gsm8k", "--jsonl-dir", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
