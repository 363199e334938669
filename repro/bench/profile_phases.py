"""Time per phase of one profiled step, beside each phase's ideal at peak (issue 35).

Reads a Chrome trace of :class:`repro.workers.profiling.StepProfiler` (``step<N>_rank<R>.trace.json``)
and prints a markdown table: phase, device ms (CPU ms on a trace with no GPU kernels), share of
the step, FLOPs, ideal ms at ``--peak-tflops`` and ideal / measured.

    python -m repro.bench.profile_phases TRACE.json --shape qwen3-0.6b --tokens N --sq-tokens M [--lm-tokens L]
    python -m repro.bench.profile_phases TRACE.json      # shape and counts from <stem>.shape.json beside it

Attribution (labels are the ``repro::<phase>`` ranges :mod:`repro.workers.profiling` opens):

- a CPU op takes the label of its innermost enclosing ``repro::`` range on its thread; an
  ``autograd::engine::evaluate_function:`` range met first on the way out (a backward op and its
  children) takes the label of the forward op with the same ``Sequence number`` on the forward
  thread (the profiler's ``fwdbwd`` flows map each "Fwd thread id" to a thread; an id no flow
  maps: the backward op's own thread, else any), the latest before it;
  an op named for a collective (``nccl``, ``gloo``, ``c10d::``, ``record_param_comms``) is
  ``communication``; ``AccumulateGrad`` (no sequence number) and the gradient hooks that run in
  it (DeepSpeed ZeRO-1/2's bucket copies) are ``grad_accumulate``; nothing: ``unlabeled``
  (the loss, DeepSpeed's Python between ops, ZeRO-3's parameter fetch). A recomputed forward (activation checkpointing) runs
  inside its backward but opens its module's range again, so it is labelled as a forward;
- a GPU kernel (also memcpy / memset) takes the label of the CPU op that launched it: the op
  with its ``External id``, else the op around the runtime call with its ``correlation``; a
  kernel whose name contains ``nccl`` is ``communication``;
- the step is the wall span from the first CPU op to the last op or kernel. Each instant of it
  goes to the phases of the device events (CPU mode: the ops' self time) running then, split
  evenly between them; communication gets only instants with no other event (overlapped
  communication is printed under the table); instants with none go to ``idle/launch``. So the
  rows sum to the step.

FLOPs of one forward + backward over the batch, from ``repro.rl.mfu.flops_by_part`` (verl's MFU
terms split by part; ``T`` tokens = sum of lengths, ``S`` = sum of squared lengths, ``h`` hidden,
``L`` layers, ``a`` heads, ``d`` head dim, ``k`` KV heads, ``f`` MLP width, ``V`` vocabulary):

- attention: ``6 T L h (2 a d + 2 k d) + 6 S d a L`` (projections and scores);
- mlp: ``6 T L 3 h f``;
- lm_head: ``6 T' V h`` with ``T'`` = ``--lm-tokens`` (the positions that need logits: the
  response tokens; default ``T``, which is what the MFU formula counts);
- embedding: 0 here (a gather); the MFU formula counts ``6 T V h`` for it, which the footer's
  MFU total includes;
- norm, logprob, optimizer, communication: no matmul FLOPs (memory-bound), no ideal given.

Ideal ms = FLOPs / peak. A recomputed forward (activation checkpointing) is work the ideal does
not count. Imports the standard library; ``repro.rl.mfu`` (torch) and, for ``--shape NAME``,
``repro.bench.workers`` (transformers) only when FLOPs are asked for.
"""

from __future__ import annotations

import argparse
import bisect
import json
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

PREFIX = "repro::"
EVALUATE = "autograd::engine::evaluate_function:"
COMM_MARKS = ("nccl", "gloo", "c10d::", "record_param_comms")
CPU_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
ACCUMULATE = "torch::autograd::AccumulateGrad"
COMM, IDLE, UNLABELED, GRAD_ACC = "communication", "idle/launch", "unlabeled", "grad_accumulate"
ORDER = ("attention", "mlp", "norm", "embedding", "lm_head", "logprob", "optimizer", GRAD_ACC, COMM, UNLABELED, IDLE)
SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "vocab_size")


def _is_comm(name: str) -> bool:
    low = name.lower()
    return any(mark in low for mark in COMM_MARKS)


class Trace:
    """The events of one Chrome trace, nested per thread, with the labels of the rules above."""

    def __init__(self, trace: dict[str, Any]) -> None:
        events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
        self.cpu = [e for e in events if e.get("cat") in CPU_CATS]
        self.device = [e for e in events if e.get("cat") in DEVICE_CATS]
        self.parent: list[int | None] = [None] * len(self.cpu)
        self.children: list[list[int]] = [[] for _ in self.cpu]
        by_thread: dict[Any, list[int]] = defaultdict(list)
        for i, e in enumerate(self.cpu):
            by_thread[(e["pid"], e["tid"])].append(i)
        self.starts: dict[Any, tuple[list[float], list[int]]] = {}
        for key, idx in by_thread.items():
            idx.sort(key=lambda i: (self.cpu[i]["ts"], -self.cpu[i]["dur"]))
            stack: list[int] = []
            for i in idx:
                e = self.cpu[i]
                while stack and self._end(stack[-1]) <= e["ts"]:
                    stack.pop()
                if stack:
                    self.parent[i] = stack[-1]
                    self.children[stack[-1]].append(i)
                stack.append(i)
            self.starts[key] = ([self.cpu[i]["ts"] for i in idx], idx)
        self._link_backward(trace.get("traceEvents", []))
        self.by_external = {e["args"]["External id"]: i for i, e in enumerate(self.cpu)
                            if e.get("cat") in ("cpu_op", "user_annotation") and "External id" in e.get("args", {})}
        self.runtime_by_corr = {e["args"]["correlation"]: i for i, e in enumerate(self.cpu)
                                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
        self._labels: dict[int, str] = {}

    def _end(self, i: int) -> float:
        return self.cpu[i]["ts"] + self.cpu[i]["dur"]

    def _at(self, thread: Any, ts: float) -> int | None:
        """The innermost op of ``thread`` that starts at ``ts`` and carries a sequence number."""
        if thread not in self.starts:
            return None
        times, idx = self.starts[thread]
        lo, hi = bisect.bisect_left(times, ts), bisect.bisect_right(times, ts)
        hits = [idx[k] for k in range(lo, hi) if "Sequence number" in self.cpu[idx[k]].get("args", {})]
        return hits[-1] if hits else None

    def _link_backward(self, raw: list[dict[str, Any]]) -> None:
        """Forward ops by (forward thread, sequence number); which thread a backward's "Fwd thread id"
        means, from the profiler's fwdbwd flows (start: the forward op, end: the backward node)."""
        self.forward: dict[tuple[Any, int], list[int]] = defaultdict(list)
        for i, e in enumerate(self.cpu):
            args = e.get("args", {})
            if (e.get("cat") == "cpu_op" and "Sequence number" in args and not args.get("Fwd thread id")
                    and not e["name"].startswith(EVALUATE)):
                self.forward[((e["pid"], e["tid"]), args["Sequence number"])].append(i)
        flows: dict[Any, dict[str, dict[str, Any]]] = defaultdict(dict)
        for e in raw:
            if e.get("cat") == "fwdbwd" and e.get("ph") in ("s", "f"):
                flows[e.get("id")][e["ph"]] = e
        self.fwd_thread: dict[Any, Any] = {}
        for pair in flows.values():
            if "s" in pair and "f" in pair:
                s, f = pair["s"], pair["f"]
                bwd = self._at((f["pid"], f["tid"]), f["ts"])
                if bwd is not None:
                    self.fwd_thread[self.cpu[bwd]["args"].get("Fwd thread id")] = (s["pid"], s["tid"])

    def forward_of(self, i: int) -> int | None:
        """The forward op of the backward range ``i``: same sequence number on its forward thread (the
        flows' answer; else its own thread, else any), the latest one before it."""
        e = self.cpu[i]
        args = e.get("args", {})
        if "Sequence number" not in args:
            return None
        seq = args["Sequence number"]
        own = (e["pid"], e["tid"])
        thread = self.fwd_thread.get(args.get("Fwd thread id"))
        if thread is None:
            thread = own if (own, seq) in self.forward else None
        threads = [thread] if thread is not None else [t for t in self.starts if (t, seq) in self.forward]
        cands = [j for t in threads for j in self.forward.get((t, seq), []) if self.cpu[j]["ts"] <= e["ts"]]
        return max(cands, key=lambda j: self.cpu[j]["ts"]) if cands else None

    def label(self, i: int) -> str:
        """The phase of CPU event ``i`` (the rules in the module docstring)."""
        if i in self._labels:
            return self._labels[i]
        self._labels[i] = UNLABELED  # a cycle (none expected) ends unlabelled
        j: int | None = i
        found = UNLABELED
        while j is not None:
            name = self.cpu[j]["name"]
            if name.startswith(PREFIX):
                found = name[len(PREFIX):]
                break
            if _is_comm(name):
                found = COMM
                break
            if name.endswith(ACCUMULATE):
                found = GRAD_ACC
                break
            if name.startswith(EVALUATE):
                fwd = self.forward_of(j)
                found = self.label(fwd) if fwd is not None else UNLABELED
                break
            j = self.parent[j]
        self._labels[i] = found
        return found

    def launcher(self, kernel: dict[str, Any]) -> int | None:
        """The CPU op that launched ``kernel``: by External id, else around its runtime call."""
        args = kernel.get("args", {})
        if args.get("External id") in self.by_external:
            return self.by_external[args["External id"]]
        runtime = self.runtime_by_corr.get(args.get("correlation"))
        return self.parent[runtime] if runtime is not None else None

    def self_intervals(self, i: int) -> list[tuple[float, float]]:
        """The parts of CPU event ``i``'s span that none of its children cover."""
        start, end = self.cpu[i]["ts"], self._end(i)
        pieces, cursor = [], start
        for c in sorted(self.children[i], key=lambda c: self.cpu[c]["ts"]):
            cs, ce = self.cpu[c]["ts"], min(self._end(c), end)
            if cs > cursor:
                pieces.append((cursor, cs))
            cursor = max(cursor, ce)
        if end > cursor:
            pieces.append((cursor, end))
        return pieces


def attribute(trace: dict[str, Any]) -> dict[str, Any]:
    """``{"mode": "device" | "cpu", "step_us", "phases": {phase: us}, "overlapped_comm_us"}``."""
    t = Trace(trace)
    pieces: list[tuple[float, float, str]] = []
    if t.device:
        mode = "device"
        for k in t.device:
            op = None if _is_comm(k["name"]) else t.launcher(k)
            phase = COMM if _is_comm(k["name"]) else (t.label(op) if op is not None else UNLABELED)
            pieces.append((k["ts"], k["ts"] + k["dur"], phase))
    else:
        mode = "cpu"
        for i, e in enumerate(t.cpu):
            if e.get("cat") in ("cpu_op", "user_annotation"):
                phase = t.label(i)
                pieces.extend((s, end, phase) for s, end in t.self_intervals(i))
    ends = [e["ts"] + e["dur"] for e in t.cpu + t.device]
    if not t.cpu:
        return {"mode": mode, "step_us": 0.0, "phases": {}, "overlapped_comm_us": 0.0}
    start, stop = min(e["ts"] for e in t.cpu), max(ends)
    phases, overlapped = sweep(pieces, start, stop)
    return {"mode": mode, "step_us": stop - start, "phases": phases, "overlapped_comm_us": overlapped}


def sweep(pieces: list[tuple[float, float, str]], start: float, stop: float) -> tuple[dict[str, float], float]:
    """Split ``[start, stop]`` between the phases of the pieces running at each instant (module docstring)."""
    marks = sorted([(s, 1, p) for s, e, p in pieces if e > s] + [(e, -1, p) for s, e, p in pieces if e > s],
                   key=lambda m: (m[0], m[1]))
    active: dict[str, int] = defaultdict(int)
    out: dict[str, float] = defaultdict(float)
    overlapped, now = 0.0, start
    for ts, delta, phase in marks + [(stop, 0, IDLE)]:
        ts = min(max(ts, start), stop)
        span = ts - now
        if span > 0:
            compute = {p: n for p, n in active.items() if n > 0 and p != COMM}
            if compute:
                total = sum(compute.values())
                for p, n in compute.items():
                    out[p] += span * n / total
                if active.get(COMM, 0) > 0:
                    overlapped += span
            elif active.get(COMM, 0) > 0:
                out[COMM] += span
            else:
                out[IDLE] += span
            now = ts
        active[phase] += delta
    return dict(out), overlapped


def shape_config(shape: str | dict[str, Any]) -> Any:
    """A model shape from a dict of Hugging Face config keys, a ``config.json`` path, or a bench name."""
    if isinstance(shape, dict):
        return SimpleNamespace(**{k: shape.get(k) for k in SHAPE_KEYS})
    if shape.endswith(".json"):
        return shape_config(json.loads(Path(shape).read_text()))
    from repro.bench.workers import _model_config

    return _model_config(shape)


def shape_dict(config: Any) -> dict[str, Any]:
    """The keys of ``config`` the FLOP count reads (what the bench writes beside a trace)."""
    return {k: getattr(config, k, None) for k in SHAPE_KEYS}


def flops(config: Any, tokens: int, sq_tokens: int, lm_tokens: int | None = None) -> dict[str, float]:
    """FLOPs per phase (module docstring) and ``"mfu_total"``, the MFU formula's whole count."""
    from repro.rl.mfu import flops_by_part

    parts = flops_by_part(config, tokens, sq_tokens)
    if not parts:
        return {}
    per_token_head = parts["lm_head"] / tokens if tokens else 0.0
    return {"attention": parts["attention"], "mlp": parts["mlp"],
            "lm_head": per_token_head * (tokens if lm_tokens is None else lm_tokens),
            "embedding": 0.0, "mfu_total": sum(parts.values())}


def _pct(x: float) -> str:
    """A share in percent: one decimal, or three significant digits below 0.1%."""
    return f"{x:.1%}" if x >= 1e-3 or x == 0 else f"{x * 100:.3g}%"


def table(result: dict[str, Any], phase_flops: dict[str, float] | None = None, peak_tflops: float = 989.0) -> str:
    """The markdown table of :func:`attribute`'s ``result`` (FLOP columns when ``phase_flops``)."""
    phase_flops = phase_flops or {}
    step_ms = result["step_us"] / 1e3
    unit = "device ms" if result["mode"] == "device" else "CPU ms"
    peak = peak_tflops * 1e12
    lines = [f"| phase | {unit} | share | GFLOP | ideal ms | ideal / measured |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    phases = result["phases"]
    names = [p for p in ORDER if p in phases or p in ("attention", "mlp", "lm_head", "logprob", "optimizer")]
    names += sorted(p for p in phases if p not in ORDER)
    for p in names:
        ms = phases.get(p, 0.0) / 1e3
        share = _pct(ms / step_ms) if step_ms else "-"
        if p in phase_flops:
            f = phase_flops[p]
            ideal = f / peak * 1e3
            cells = [f"{f / 1e9:.4g}", f"{ideal:.4g}", _pct(ideal / ms) if ms and f else "-"]
        else:
            cells = ["-", "-", "-"]
        lines.append(f"| {p} | {ms:.3f} | {share} | " + " | ".join(cells) + " |")
    total_f = sum(v for k, v in phase_flops.items() if k != "mfu_total")
    total_ideal = total_f / peak * 1e3
    total_cells = [f"{total_f / 1e9:.4g}", f"{total_ideal:.4g}", _pct(total_ideal / step_ms) if step_ms else "-"] \
        if phase_flops else ["-", "-", "-"]
    lines.append(f"| **step** | {step_ms:.3f} | 100.0% | " + " | ".join(total_cells) + " |")
    notes = [f"peak {peak_tflops:g} TFLOP/s; communication overlapped with other work (not in its row): "
             f"{result['overlapped_comm_us'] / 1e3:.3f} ms"]
    if "mfu_total" in phase_flops:
        mfu_ms = phase_flops["mfu_total"] / peak * 1e3
        notes.append(f"MFU formula's count (embedding and LM head on every token): {phase_flops['mfu_total'] / 1e9:.4g} GFLOP, "
                     f"{mfu_ms:.4g} ms at peak, MFU of this step {_pct(mfu_ms / step_ms)}" if step_ms else "")
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes if n) + "\n"


def report(trace_path: str | Path, meta: dict[str, Any] | None = None, peak_tflops: float = 989.0) -> str:
    """The table of one trace; ``meta``: ``{"shape": ..., "tokens", "sq_tokens", "lm_tokens"?}`` (or None)."""
    result = attribute(json.loads(Path(trace_path).read_text()))
    phase_flops = None
    if meta and meta.get("shape") is not None and meta.get("tokens") is not None:
        phase_flops = flops(shape_config(meta["shape"]), int(meta["tokens"]), int(meta.get("sq_tokens") or 0),
                            meta.get("lm_tokens"))
    return table(result, phase_flops, peak_tflops)


def meta_path(trace_path: str | Path) -> Path:
    """``<stem>.shape.json`` beside ``<stem>.trace.json``: the shape and token counts of its batch."""
    name = Path(trace_path).name
    stem = name[: -len(".trace.json")] if name.endswith(".trace.json") else Path(name).stem
    return Path(trace_path).with_name(stem + ".shape.json")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", help="step<N>_rank<R>.trace.json written by StepProfiler")
    parser.add_argument("--shape", default=None, help="qwen3-0.6b, tiny, or a Hugging Face config.json")
    parser.add_argument("--tokens", type=int, default=None, help="sum of the sequences' lengths")
    parser.add_argument("--sq-tokens", type=int, default=None, help="sum of the squared lengths")
    parser.add_argument("--lm-tokens", type=int, default=None, help="positions the LM head needs (default --tokens)")
    parser.add_argument("--meta", default=None, help="json with shape, tokens, sq_tokens, lm_tokens "
                                                     "(default: <stem>.shape.json beside the trace, if there)")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="peak of the ideal column (H100 dense bf16)")
    parser.add_argument("--out", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    meta: dict[str, Any] = {}
    path = Path(args.meta) if args.meta else meta_path(args.trace)
    if path.is_file():
        meta = json.loads(path.read_text())
    for key in ("shape", "tokens", "sq_tokens", "lm_tokens"):
        if getattr(args, key) is not None:
            meta[key] = getattr(args, key)
    text = report(args.trace, meta, args.peak_tflops)
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
