"""All-to-all split sizes: what each rank sends to and expects from every peer, and their cross-check.

``all_to_all_single`` with ``input_split_sizes``/``output_split_sizes`` (and ``all_to_all`` with
per-peer tensors) legitimately moves different amounts per rank, so its total size is not part of
the fingerprint. What must agree is pairwise: what rank i sends to rank j equals what rank j
expects from rank i. A call's ``detail`` holds ``["splits", send numels, recv numels]`` by
group rank.
"""

from __future__ import annotations

from typing import Any


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

