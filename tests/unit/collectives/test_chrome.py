"""Chrome / Perfetto export: one process per rank, a track per group, the divergence marked."""

from __future__ import annotations

import json

from repro.collectives.analyze.align import first_divergence
from repro.collectives.analyze.formats import to_chrome_trace, write_chrome_trace
from tests.unit.collectives.helpers import trace


def test_export_marks_divergent_calls_and_adds_a_global_instant_event(tmp_path):
    traces = {
        0: trace(0, [("all_reduce", 4), ("all_reduce", 1)]),
        1: trace(1, [("all_reduce", 4), ("all_reduce", 8)]),
    }
    traces[1].calls[-1].t_end = None
    d = first_divergence(traces)
    doc = to_chrome_trace(traces, d)
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 4 and {e["pid"] for e in xs} == {0, 1}
    marked = [e for e in xs if e.get("cname") == "terrible"]
    assert sorted((e["pid"], e["args"]["numel"]) for e in marked) == [(0, 1), (1, 8)]
    assert any(e["name"].endswith("(never returned)") for e in marked)
    instant = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert len(instant) == 1 and instant[0]["name"].startswith("DIVERGENCE: Collective mismatch")
    assert xs[0]["ts"] == 0.0 and xs[0]["dur"] == 0.5e6
    path = tmp_path / "out" / "trace.json"
    write_chrome_trace(traces, d, path)
    assert json.loads(path.read_text())["metadata"]["divergence"] == doc["metadata"]["divergence"]


def test_export_without_divergence_marks_nothing():
    traces = {0: trace(0, [("all_reduce", 4)]), 1: trace(1, [("all_reduce", 4)])}
    doc = to_chrome_trace(traces, None)
    assert not [e for e in doc["traceEvents"] if e.get("cname")] and doc["metadata"]["divergence"] is None
