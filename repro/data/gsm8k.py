"""GSM8K jsonl -> parquet in verl's schema (what ``examples/data_preprocess/gsm8k.py`` writes).

Each jsonl line ``{"question": ..., "answer": "... #### 72"}`` becomes::

    data_source  "openai/gsm8k"
    prompt       [{"role": "user", "content": question + " " + INSTRUCTION}]
    ability      "math"
    reward_model {"style": "rule", "ground_truth": "72"}          (commas removed)
    extra_info   {"split", "index", "answer" (full text), "question" (without the instruction)}

Every line is validated before anything is written; errors name the file and line number.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from repro.data.parquet_io import write_rows

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = ("train", "test")

_FINAL = re.compile(r"#### (-?[0-9.,]+)")


def ground_truth_of(answer: str) -> str | None:
    """The final number after ``#### `` with commas removed, or ``None`` if there is none."""
    found = _FINAL.search(answer)
    if found is None:
        return None
    return found.group(1).replace(",", "")


def make_row(question: str, answer: str, split: str, index: int, ground_truth: str) -> dict[str, Any]:
    """One parquet row in verl's GSM8K schema."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def read_jsonl(path: str | os.PathLike[str], split: str) -> list[dict[str, Any]]:
    """Parse and validate a GSM8K jsonl file into parquet rows."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"GSM8K {split} file {path} does not exist (expected {SPLITS} as <split>.jsonl)")
    rows: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
            for key in ("question", "answer"):
                if not isinstance(record.get(key), str):
                    raise ValueError(f"{where}: missing string field {key!r} (keys: {sorted(record)})")
            truth = ground_truth_of(record["answer"])
            if truth is None:
                raise ValueError(f"{where}: answer has no '#### <number>' final answer")
            rows.append(make_row(record["question"], record["answer"], split, len(rows), truth))
    if not rows:
        raise ValueError(f"{path}: no GSM8K records")
    return rows


def convert(jsonl_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str],
            splits: tuple[str, ...] = SPLITS) -> dict[str, Path]:
    """Convert ``<jsonl_dir>/<split>.jsonl`` to ``<out_dir>/<split>.parquet`` for each split."""
    for split in splits:
        if split not in SPLITS:
            raise ValueError(f"unknown GSM8K split {split!r}; valid splits: {list(SPLITS)}")
    # Parse every split first so a bad test file does not leave a fresh train file behind.
    parsed = {split: read_jsonl(Path(jsonl_dir) / f"{split}.jsonl", split) for split in splits}
    return {split: write_rows(rows, Path(out_dir) / f"{split}.parquet") for split, rows in parsed.items()}
