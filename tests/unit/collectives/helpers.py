"""Builders of synthetic call records for the pure tests of alignment, reports and export."""

from __future__ import annotations

from repro.collectives.events import CallRecord, RankTrace


def call(
    rank: int,
    seq: int,
    op: str = "all_reduce",
    numel: int = 4,
    dtype: str = "float32",
    site: str | None = None,
    group: str = "0",
    ranks: tuple[int, ...] = (0, 1),
    t: float | None = None,
    returned: bool = True,
) -> CallRecord:
    t = float(seq) if t is None else t
    return CallRecord(
        rank=rank,
        index=seq,
        op=op,
        group=group,
        ranks=ranks,
        group_seq=seq,
        numel=numel,
        dtype=dtype,
        site=site or f"train.py:{10 + seq} step",
        t=t,
        t_end=t + 0.5 if returned else None,
        redop="SUM" if op == "all_reduce" else None,
    )


def trace(rank: int, specs: list[tuple], **kw) -> RankTrace:
    """``specs``: (op, numel[, site]) per call, numbered from 1 on group "0"."""
    calls = []
    for i, spec in enumerate(specs, start=1):
        op, numel, *rest = spec
        calls.append(call(rank, i, op, numel, site=rest[0] if rest else f"train.py:{op}{numel}", **kw))
    return RankTrace(rank=rank, calls=calls, groups={"0": (0, 1)})
