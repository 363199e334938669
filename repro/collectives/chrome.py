"""Export traces as Chrome / Perfetto trace-event JSON, with the first divergence marked.

One process per rank, one thread (track) per process group. Each call is a complete ("X") event
from its start to its return; a call that never returned runs to the end of the trace and is
named "... (never returned)". The divergent calls are coloured red ("terrible") and a global
instant event carries the headline, so it shows in chrome://tracing and ui.perfetto.dev.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from repro.collectives.align import Divergence
from repro.collectives.events import RankTrace
from repro.collectives.report import headline


def to_chrome_trace(traces: dict[int, RankTrace], divergence: Divergence | None) -> dict[str, Any]:
    """The trace-event document (``{"traceEvents": [...]}``), timestamps in microseconds."""
    starts = [c.t for t in traces.values() for c in t.calls if c.t]
    if not starts:
        return {"traceEvents": [], "displayTimeUnit": "ms", "metadata": {"divergence": None}}
    t0 = min(starts)
    t_last = max(max(c.t_end or c.t for t in traces.values() for c in t.calls), t0)
    marked: set[tuple[int, int]] = set()
    if divergence is not None:
        for c in (divergence.call_a, divergence.call_b, *divergence.extra_calls):
            if c is not None:
                marked.add((c.rank if c.rank >= 0 else divergence.rank_a, c.index))
    events: list[dict[str, Any]] = []
    for rank, trace in sorted(traces.items()):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        tids: dict[str, int] = {}
        for c in trace.calls:
            key = "p2p" if c.group_seq is None else c.group
            if key not in tids:
                tids[key] = len(tids)
                label = "p2p" if key == "p2p" else f"group {key} {list(c.ranks)}"
                events.append(
                    {"ph": "M", "name": "thread_name", "pid": rank, "tid": tids[key], "args": {"name": label}}
                )
            end = c.t_end if c.t_end is not None else t_last
            ev = {
                "ph": "X",
                "name": c.op + ("" if c.t_end is not None else " (never returned)"),
                "cat": "collective" if c.group_seq is not None else "p2p",
                "pid": rank,
                "tid": tids[key],
                "ts": (c.t - t0) * 1e6,
                "dur": max((end - c.t) * 1e6, 1.0),
                "args": {
                    "seq": c.group_seq,
                    "numel": c.numel,
                    "dtype": c.dtype,
                    "site": c.site,
                    "library_site": c.lib_site,
                    "root": c.root,
                    "peer": c.peer,
                    "reduce_op": c.redop,
                },
            }
            if (rank, c.index) in marked:
                ev["cname"] = "terrible"
                ev["args"]["divergence"] = divergence.kind
            events.append(ev)
    meta: dict[str, Any] = {"divergence": None}
    if divergence is not None:
        text = headline(divergence)
        meta["divergence"] = text
        at = divergence.call_a.t if divergence.call_a else t0
        events.append(
            {
                "ph": "i",
                "s": "g",
                "name": f"DIVERGENCE: {text}",
                "pid": divergence.rank_a,
                "tid": 0,
                "ts": (at - t0) * 1e6,
                "cname": "terrible",
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": meta}


def write_chrome_trace(
    traces: dict[int, RankTrace], divergence: Divergence | None, path: pathlib.Path
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_chrome_trace(traces, divergence)))
