"""Atomic parquet writing for the RL data sets (verl's row schema).

A file is written under a temporary name in the target folder and renamed into place, so a
crash or a bad row never leaves a half-written parquet where a trainer would read it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

# Column order of verl's preprocessed parquet files.
COLUMNS = ("data_source", "prompt", "ability", "reward_model", "extra_info")


def write_rows(rows: list[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write verl-schema rows to ``path`` atomically; returns the path."""
    path = Path(path)
    if not rows:
        raise ValueError(f"refusing to write {path}: no rows")
    for i, row in enumerate(rows):
        if set(row) != set(COLUMNS):
            raise ValueError(f"row {i} for {path} has keys {sorted(row)}, expected {list(COLUMNS)}")
    table = pa.Table.from_pylist([{k: row[k] for k in COLUMNS} for row in rows])
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a verl-schema parquet back as a list of row dicts."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"parquet file {path} does not exist")
    return pq.read_table(path).to_pylist()
