"""What the host was doing while the GPU idled, in one profiled step (issue 35).

:mod:`repro.bench.profile_phases` puts every instant with no kernel on the GPU into ``idle/launch``.
On a launch- or sync-bound step that row is most of the step (the 0.6B update on an H100: 87%,
``results/actor_update/README.md``), and the question becomes which host work fills it. This module
answers from the same Chrome trace:

- the GPU's idle instants are the step's span (first CPU op to last event) less the union of its
  device events (kernels, memcpy, memset);
- at each idle instant, each CPU thread that has a profiled op running contributes its innermost
  op (the part of an op that none of its children cover, so ``cudaStreamSynchronize`` inside
  ``aten::item`` counts as the former); the instant is split evenly between the threads that have one;
- an idle instant with no op on any thread is ``(no profiled op)``: Python between ops, the
  profiler's own work, or anything torch does not record.

Two views of the same time: by the innermost op's name (the launches, syncs and copies), and by the
phase label :class:`~repro.bench.trace_events.Trace` gives that op (which part of the step). Each
sums to the idle total. Imports the standard library and :mod:`repro.bench.trace_events` only.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

from repro.bench.trace_events import Trace

NO_OP = "(no profiled op)"


def idle_intervals(device: list[dict[str, Any]], start: float, stop: float) -> list[tuple[float, float]]:
    """``[start, stop]`` less the union of the device events' spans, in order."""
    idle, cursor = [], start
    for s, e in sorted((d["ts"], d["ts"] + d["dur"]) for d in device):
        if s > cursor:
            idle.append((cursor, min(s, stop)))
        cursor = max(cursor, e)
        if cursor >= stop:
            break
    if stop > cursor:
        idle.append((cursor, stop))
    return [(s, e) for s, e in idle if e > s]


def _clip(s: float, e: float, idle: list[tuple[float, float]], starts: list[float]) -> list[tuple[float, float]]:
    """The parts of ``[s, e]`` inside the idle intervals."""
    out = []
    k = max(bisect.bisect_right(starts, s) - 1, 0)
    while k < len(idle) and idle[k][0] < e:
        lo, hi = max(s, idle[k][0]), min(e, idle[k][1])
        if hi > lo:
            out.append((lo, hi))
        k += 1
    return out


def _split(pieces: list[tuple[float, float, Any, str]], idle: list[tuple[float, float]]) -> dict[str, float]:
    """Each idle instant split evenly between the threads with a piece then (``NO_OP`` when none)."""
    marks = sorted([(s, 1, th, key) for s, e, th, key in pieces] + [(e, -1, th, key) for s, e, th, key in pieces],
                   key=lambda m: (m[0], m[1]))
    running: dict[Any, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    out: dict[str, float] = defaultdict(float)
    bounds = sorted({t for s, e in idle for t in (s, e)} | {m[0] for m in marks})
    starts = [s for s, _ in idle]
    k = 0
    for a, b in zip(bounds, bounds[1:], strict=False):  # consecutive bounds: one shorter by design
        while k < len(marks) and marks[k][0] <= a:
            _, delta, th, key = marks[k]
            running[th][key] += delta
            if not running[th][key]:
                del running[th][key]  # keep only what runs: a trace has hundreds of op names
            k += 1
        j = bisect.bisect_right(starts, a) - 1
        if j < 0 or not idle[j][0] <= a < idle[j][1]:
            continue  # the GPU is busy here
        threads = [keys for keys in running.values() if keys]
        if not threads:
            out[NO_OP] += b - a
        for keys in threads:
            for key, n in keys.items():
                out[key] += (b - a) / len(threads) * n / sum(keys.values())
    return dict(out)


def idle_host(trace: dict[str, Any] | Trace) -> dict[str, Any] | None:
    """``{"step_us", "idle_us", "by_op": {name: us}, "by_phase": {phase: us}}``; None without device events."""
    t = Trace.of(trace)
    if not t.device or not t.cpu:
        return None
    start = min(e["ts"] for e in t.cpu)
    stop = max(e["ts"] + e["dur"] for e in t.cpu + t.device)
    idle = idle_intervals(t.device, start, stop)
    starts = [s for s, _ in idle]
    by_op, by_phase = [], []
    for i, e in enumerate(t.cpu):
        thread = (e["pid"], e["tid"])
        for s, end in t.self_intervals(i):
            for lo, hi in _clip(s, end, idle, starts):
                by_op.append((lo, hi, thread, e["name"]))
                by_phase.append((lo, hi, thread, t.label(i)))
    return {"step_us": stop - start, "idle_us": sum(e - s for s, e in idle),
            "by_op": _split(by_op, idle), "by_phase": _split(by_phase, idle)}


def idle_table(result: dict[str, Any] | None, top: int = 12) -> str:
    """Markdown: the idle total, then the top ops and every phase by idle ms (empty without a result)."""
    if not result or result["idle_us"] <= 0:
        return ""
    idle_ms = result["idle_us"] / 1e3
    lines = [f"GPU idle {idle_ms:.3f} ms of the {result['step_us'] / 1e3:.3f} ms step; what the host was doing then:", ""]
    for title, data, n in (("innermost op", result["by_op"], top), ("its phase", result["by_phase"], len(result["by_phase"]))):
        lines += [f"| {title} | idle ms | share of idle |", "| --- | ---: | ---: |"]
        ranked = sorted(data.items(), key=lambda kv: -kv[1])
        for key, us in ranked[:n]:
            lines.append(f"| {key} | {us / 1e3:.3f} | {us / result['idle_us']:.1%} |")
        rest = sum(us for _, us in ranked[n:])
        if rest:
            lines.append(f"| (the other {len(ranked) - n}) | {rest / 1e3:.3f} | {rest / result['idle_us']:.1%} |")
        lines.append("")
    return "\n".join(lines)
