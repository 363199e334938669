"""Hypothesis-made inputs shared by the verl parity tests, and how they compare.

Where repro runs verl's arithmetic in verl's order the comparison is bitwise (``close`` with no
``terms``); where the two sum in different orders (a mean computed as sum / n or with
``torch.mean``, a whitening's variance, a Python formula regrouped) the tolerance is the error
model's (``tests/error_model.py``): ``terms`` accumulations at the values' ``magnitude``.

Every batch is ``[B, R]`` with right-padded response masks whose lengths may be 0 (an empty,
aborted response); ``poison`` fills the positions outside the mask with NaN, +inf or -inf, which
neither library may let into a masked reduction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from tests.error_model import float_tol


def close(actual: torch.Tensor | float, expected: torch.Tensor | float, terms: int = 0,
          magnitude: float | None = None, dtype: torch.dtype = torch.float32) -> None:
    """Bitwise equal (``terms=0``), or within the error model's bound of ``terms`` accumulations in
    ``dtype`` at ``magnitude`` (default: the largest finite ``|expected|``); NaN where the other is NaN."""
    expected = torch.as_tensor(expected, dtype=torch.float64)
    atol = 0.0
    if terms:
        if magnitude is None:
            finite = expected[torch.isfinite(expected)]
            magnitude = float(finite.abs().max()) if finite.numel() else 0.0
        atol = float_tol(terms, magnitude, dtype)
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float64), expected,
                               atol=atol, rtol=0.0, equal_nan=True)


def whiten_magnitude(x: torch.Tensor, mask: torch.Tensor) -> float:
    """Error scale of y = (x - mean) / std over the masked tokens: the mean's error (eps n max|x|)
    divided by std, plus y times the std's relative error (half the variance's, eps n max|x - mean|^2
    / var = eps n max|y|^2): max|x| / std + max|y|^3."""
    v = x[mask.bool()].double()
    if v.numel() == 0:
        return 0.0
    std = float(v.std()) if v.numel() > 1 else 1.0
    std = std if std > 0 else 1.0
    y = float((v - v.mean()).abs().max()) / std
    return float(v.abs().max()) / std + y ** 3


@dataclass
class TokenBatch:
    values: torch.Tensor
    other: torch.Tensor
    mask: torch.Tensor
    lengths: list[int]

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.mask.shape)  # type: ignore[return-value]


@st.composite
def token_batches(draw, min_rows: int = 1, max_rows: int = 6, max_len: int = 5, poison: bool | None = None,
                  min_tokens: int = 0) -> TokenBatch:
    rows = draw(st.integers(min_rows, max_rows))
    # Built to hold ``min_tokens`` rather than filtered for it: a filter (or an ``assume``) that
    # rejects most draws fails hypothesis's filter_too_much health check under a random seed,
    # so a local run would be less green than CI's derandomized one.
    width = draw(st.integers(max(1, -(-min_tokens // rows)), max(max_len, -(-min_tokens // rows))))
    lengths = draw(st.lists(st.integers(0, width), min_size=rows, max_size=rows))
    for i in range(rows):  # top rows up in order until the batch has min_tokens real tokens
        lengths[i] = min(width, lengths[i] + max(0, min_tokens - sum(lengths)))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.sampled_from([0.1, 1.0, 3.0]))
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(rows, width, generator=gen) * scale
    other = torch.randn(rows, width, generator=gen) * scale
    mask = (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).float()
    if poison is None:
        poison = draw(st.booleans())
    if poison:
        bad = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
        values = torch.where(mask.bool(), values, torch.tensor(bad))
    return TokenBatch(values, other, mask, lengths)


def group_index(draw, rows: int, min_group: int = 1) -> list[int]:
    """Prompt ids for ``rows`` samples: groups of any size >= ``min_group`` (singletons included by
    default), in any order. Built by construction (cut points, then a shuffle), never filtered:
    see ``token_batches``. ``rows`` must be at least ``min_group``."""
    if min_group <= 1:
        return draw(st.lists(st.integers(0, 3), min_size=rows, max_size=rows))
    sizes, left = [], rows
    while left:
        size = left if left < 2 * min_group else draw(st.integers(min_group, left - min_group), label="group size")
        sizes.append(size)
        left -= size
    ids = draw(st.permutations(range(max(4, len(sizes)))))[:len(sizes)]
    index = [g for g, size in zip(ids, sizes, strict=True) for _ in range(size)]
    return list(draw(st.permutations(index)))


def zeroed_padding(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` with every position outside the mask set to 0."""
    return torch.where(mask.bool(), values, 0.0)


def leaks_into_verl(values: torch.Tensor, mask: torch.Tensor, mode: str) -> bool:
    """Whether verl 0.9.1's ``agg_loss`` lets the non-finite padding of ``values`` through: its
    seq-mean modes take ``sum(loss * mask)`` per row (``nan * 0`` is NaN) and drop only all-masked
    rows; token-mean and token-sum select with ``torch.where``."""
    if mode in ("token-mean", "token-sum"):
        return False
    return bool((~torch.isfinite(values) & (mask.sum(-1, keepdim=True) > 0)).any())
