"""Synthetic arithmetic task in verl's GSM8K parquet schema (``data_source="repro/arith"``).

A problem is a sum of ``len(digits)`` operands, operand ``i`` having exactly ``digits[i]``
digits (a 1-digit operand is 0-9). Prompt ``"Q: 23+4=? A:"``, target ``" #### 27"``: answers use
the ``#### N`` form so the GSM8K rule reward scores them unchanged. The difficulty knobs are the
digit counts and the number of operands. Everything is a pure function of the seed.

Every problem lies in exactly one *region*, fixed by a hash of the problem alone (no seed):
``rl_val`` (RL validation), ``sft_val`` (the tiny policy's SFT held-out set) or ``train`` (what
SFT and RL train on). RL validation problems are therefore never seen by SFT, as training data or
as its stopping signal, for any seed or set size, and validation accuracy measures generalisation.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import json
import math
import os
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from repro.data.parquet_io import write_rows

DATA_SOURCE = "repro/arith"
DEFAULT_DIGITS: tuple[int, ...] = (2, 1)
MAX_DIGITS = 9

Problem = tuple[int, ...]


def validate_digits(digits: Sequence[int]) -> tuple[int, ...]:
    """Check the difficulty knob; returns it as a tuple."""
    digits = tuple(int(d) for d in digits)
    if len(digits) < 2:
        raise ValueError(f"arith digits={digits}: need at least 2 operands (e.g. (2, 1))")
    if any(d < 1 or d > MAX_DIGITS for d in digits):
        raise ValueError(f"arith digits={digits}: each operand needs 1..{MAX_DIGITS} digits")
    return digits


def _operand_range(d: int) -> tuple[int, int]:
    return (0, 9) if d == 1 else (10 ** (d - 1), 10**d - 1)


def space_size(digits: Sequence[int]) -> int:
    """Number of distinct problems for these digit counts."""
    return math.prod(hi - lo + 1 for lo, hi in map(_operand_range, digits))


def question(problem: Problem) -> str:
    """Prompt text, e.g. ``"Q: 23+4=? A:"``."""
    return "Q: " + "+".join(map(str, problem)) + "=? A:"


def answer(problem: Problem) -> str:
    """Target completion, e.g. ``" #### 27"`` (the EOS token follows it in training)."""
    return f" #### {sum(problem)}"


# Shares of the problem space, out of _SHARE_TOTAL. For the default digits (900 problems) the
# regions hold 295 / 223 / 382 problems: room for 256 RL and 200 SFT validation problems.
REGIONS = ("rl_val", "sft_val", "train")
_SHARES = (6, 5, 9)
_SHARE_TOTAL = sum(_SHARES)
_BOUNDS = tuple(itertools.accumulate(_SHARES))
"""Region ``i`` holds the hashes ``h`` (mod ``_SHARE_TOTAL``) with ``_BOUNDS[i - 1] <= h < _BOUNDS[i]``
(from 0 for the first)."""
# Spaces up to this size are enumerated to size their regions exactly.
_ENUMERABLE = 200_000


@functools.lru_cache(maxsize=1 << 16)
def region(problem: Problem) -> str:
    """The region of ``problem``: a pure function of its operands."""
    digest = hashlib.sha256(("repro.arith:" + "+".join(map(str, problem))).encode()).digest()
    return REGIONS[bisect.bisect_right(_BOUNDS, int.from_bytes(digest[:8], "big") % _SHARE_TOTAL)]


def region_size(digits: tuple[int, ...], name: str) -> int:
    """Problems of ``digits`` in region ``name`` (exact for small spaces, the expected share otherwise)."""
    if name not in REGIONS:
        raise ValueError(f"arith region={name!r}; choose one of {list(REGIONS)}")
    return _region_sizes(tuple(digits))[REGIONS.index(name)]


@functools.lru_cache(maxsize=64)
def _region_sizes(digits: tuple[int, ...]) -> tuple[int, ...]:
    # Every region's size from one enumeration: a split asks for two of them, and a space near
    # _ENUMERABLE costs ~0.5 CPU s to hash through.
    size = space_size(digits)
    if size > _ENUMERABLE:
        return tuple(size * share // _SHARE_TOTAL for share in _SHARES)
    ranges = [range(lo, hi + 1) for lo, hi in map(_operand_range, digits)]
    counts = Counter(map(region.__wrapped__, itertools.product(*ranges)))  # not through the cache: each once
    return tuple(counts[name] for name in REGIONS)


def _draw(rng: random.Random, digits: tuple[int, ...]) -> Problem:
    return tuple(rng.randint(*_operand_range(d)) for d in digits)


def draw_in(rng: random.Random, digits: tuple[int, ...], name: str) -> Problem:
    """One problem of region ``name``, uniformly (rejection sampling)."""
    while True:
        p = _draw(rng, digits)
        if region(p) == name:
            return p


def unique_in(rng: random.Random, digits: tuple[int, ...], name: str, n: int, what: str) -> list[Problem]:
    """``n`` distinct problems of region ``name``, in draw order; ValueError naming ``what`` if it is too small."""
    room = region_size(digits, name)
    if n > room:
        raise ValueError(
            f"{what}={n} is more than the {room} problems of the {name!r} region for digits={digits} "
            f"(of {space_size(digits)} in all); use {what} <= {room} or more digits"
        )
    held: dict[Problem, None] = {}
    while len(held) < n:
        held.setdefault(draw_in(rng, digits, name))
    return list(held)


def split_problems(seed: int, n_train: int, n_val: int,
                   digits: Sequence[int] = DEFAULT_DIGITS) -> tuple[list[Problem], list[Problem]]:
    """Deterministic RL train / validation problems: validation unique from the ``rl_val`` region,
    training drawn with replacement from the ``train`` region."""
    digits = validate_digits(digits)
    if n_train < 1 or n_val < 1:
        raise ValueError(f"arith n_train={n_train}, n_val={n_val}: both must be >= 1")
    rng = random.Random(f"repro.arith:{seed}:{','.join(map(str, digits))}")
    val = unique_in(rng, digits, "rl_val", n_val, "arith n_val")
    train = [draw_in(rng, digits, "train") for _ in range(n_train)]
    return train, val


def make_row(problem: Problem, split: str, index: int) -> dict[str, Any]:
    """One parquet row in verl's schema."""
    q, a = question(problem), answer(problem)
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": q}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(sum(problem))},
        "extra_info": {"split": split, "index": index, "answer": a, "question": q},
    }


def write_parquet(out_dir: str | os.PathLike[str], seed: int, n_train: int, n_val: int,
                  digits: Sequence[int] = DEFAULT_DIGITS) -> tuple[Path, Path]:
    """Write ``train.parquet`` and ``val.parquet`` (plus ``arith_spec.json``) under ``out_dir``."""
    digits = validate_digits(digits)
    train, val = split_problems(seed, n_train, n_val, digits)
    out = Path(out_dir)
    spec_path = out / "arith_spec.json"
    # The spec marks a complete pair of files; drop it until both are rewritten.
    spec_path.unlink(missing_ok=True)
    train_path = write_rows([make_row(p, "train", i) for i, p in enumerate(train)], out / "train.parquet")
    val_path = write_rows([make_row(p, "val", i) for i, p in enumerate(val)], out / "val.parquet")
    spec_path.write_text(json.dumps(_spec(seed, n_train, n_val, digits), indent=1) + "\n")
    return train_path, val_path


def _spec(seed: int, n_train: int, n_val: int, digits: tuple[int, ...]) -> dict[str, Any]:
    return {"seed": seed, "n_train": n_train, "n_val": n_val, "digits": list(digits)}


def ensure_arith_parquet(out_dir: str | os.PathLike[str], seed: int = 0, n_train: int = 2048,
                         n_val: int = 256, digits: Sequence[int] = DEFAULT_DIGITS) -> tuple[Path, Path]:
    """Return ``(train_path, val_path)``, writing them unless ``out_dir`` already holds this spec."""
    digits = validate_digits(digits)
    out = Path(out_dir)
    train_path, val_path = out / "train.parquet", out / "val.parquet"
    spec_path = out / "arith_spec.json"
    if train_path.is_file() and val_path.is_file() and spec_path.is_file():
        try:
            if json.loads(spec_path.read_text()) == _spec(seed, n_train, n_val, digits):
                return train_path, val_path
        except json.JSONDecodeError:
            pass
    return write_parquet(out, seed, n_train, n_val, digits)
