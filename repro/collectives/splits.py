"""All-to-all split sizes: what each rank sends to and expects from every peer, and their cross-check.

``all_to_all_single`` with ``input_split_sizes``/``output_split_sizes`` (and ``all_to_all`` with
per-peer tensors) legitimately moves different amounts per rank, so its total size is not part of
the fingerprint. What must agree is pairwise: what rank i sends to rank j equals what rank j
expects from rank i. A call's ``detail`` holds ``["splits", send numels, recv numels]`` by
group rank.
"""

from __future__ import annotations

from typing import Any

from repro.collectives.align import Divergence
from repro.collectives.events import CallRecord, RankTrace


def _rows(tensor: Any, splits: list[int] | None, n: int) -> list[int]:
    if tensor.dim() == 0:
        return [tensor.numel()] * n
    per_row = tensor.numel() // max(tensor.shape[0], 1)
    sizes = list(splits) if splits else [tensor.shape[0] // n] * n
    return [int(s) * per_row for s in sizes]


def split_numels(op: str, params: dict[str, Any], n: int) -> list[Any]:
    """``["splits", send, recv]``: elements this rank sends to / receives from each group rank."""
    if op == "all_to_all":
        outs, ins = params.get("output_tensor_list") or [], params.get("input_tensor_list") or []
        return ["splits", [t.numel() for t in ins], [t.numel() for t in outs]]
    out, inp = params.get("output"), params.get("input")
    if out is None or inp is None:
        return []
    return [
        "splits",
        _rows(inp, params.get("input_split_sizes"), n),
        _rows(out, params.get("output_split_sizes"), n),
    ]


def split_mismatch(calls: dict[int, CallRecord], source: str) -> Divergence | None:
    """The first pair (i sends, j expects) that disagree among one all-to-all's calls, by global rank."""
    ranks = sorted(calls)
    for i in ranks:
        ci = calls[i]
        if len(ci.detail) != 3 or ci.detail[0] != "splits":
            continue
        for j in ranks:
            cj = calls[j]
            if j == i or len(cj.detail) != 3 or cj.op != ci.op:
                continue
            gi, gj = ci.ranks.index(i), cj.ranks.index(j)
            if gj >= len(ci.detail[1]) or gi >= len(cj.detail[2]):
                continue
            if ci.detail[1][gj] != cj.detail[2][gi]:
                a, b = (ci, cj) if i < j else (cj, ci)
                div = Divergence("mismatch", a.group, a.ranks, a.rank, b.rank, a, b, differing=["splits"])
                div.source = (
                    f"{source}: rank {i} sends {ci.detail[1][gj]} elements to rank {j}, "
                    f"which expects {cj.detail[2][gi]}"
                )
                return div
    return None


def trace_split_mismatch(traces: dict[int, RankTrace]) -> Divergence | None:
    """Record mode: the earliest all-to-all whose ranks' split sizes disagree."""
    by_call: dict[tuple[str, int], dict[int, CallRecord]] = {}
    for r, t in traces.items():
        for c in t.calls:
            if c.group_seq is not None and c.op in ("all_to_all", "all_to_all_single"):
                by_call.setdefault((c.group, c.group_seq), {})[r] = c
    for _key, calls in sorted(by_call.items(), key=lambda kv: min(c.t for c in kv[1].values())):
        div = split_mismatch(calls, "trace")
        if div is not None:
            return div
    return None
