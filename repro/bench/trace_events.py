"""The events of one profiled step's Chrome trace (``torch.profiler``), nested per thread and labelled
with the phase of the step they belong to (issue 35): the parsed trace that
:mod:`repro.bench.profile_phases` (time per phase) and :mod:`repro.bench.profile_idle` (the host while
the GPU idles) read. Labels are the ``repro::<phase>`` ranges :mod:`repro.workers.profiling` opens;
the rules are :meth:`Trace.label`'s and :meth:`Trace.launcher`'s, written out in
:mod:`repro.bench.profile_phases`' docstring. Imports the standard library only.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

PREFIX = "repro::"
EVALUATE = "autograd::engine::evaluate_function:"
COMM_MARKS = ("nccl", "gloo", "c10d::", "record_param_comms")
CPU_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
ACCUMULATE = "torch::autograd::AccumulateGrad"
COMM, UNLABELED, GRAD_ACC = "communication", "unlabeled", "grad_accumulate"
COMPILED_MARK = "Torch-Compiled Region"  # dynamo's range around each run of a compiled frame
COMPILED = "compiled_layers"


def is_comm(name: str) -> bool:
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

    @classmethod
    def of(cls, trace: dict[str, Any] | Trace) -> Trace:
        """``trace`` parsed, or as it is when already parsed (a report reads one trace several ways)."""
        return trace if isinstance(trace, Trace) else cls(trace)

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
        compiled = False  # inside a compiled region: its label unless a repro:: range encloses it
        while j is not None:
            name = self.cpu[j]["name"]
            if name.startswith(PREFIX):
                found = name[len(PREFIX):]
                break
            if is_comm(name):
                found = COMM
                break
            if name.endswith(ACCUMULATE):
                found = GRAD_ACC
                break
            if name.startswith(EVALUATE):
                fwd = self.forward_of(j)
                found = self.label(fwd) if fwd is not None else UNLABELED
                break
            compiled = compiled or name.startswith(COMPILED_MARK)
            j = self.parent[j]
        if found == UNLABELED and compiled:
            found = COMPILED
        self._labels[i] = found
        return found

    def launcher(self, kernel: dict[str, Any]) -> int | None:
        """The CPU op that launched ``kernel``: by External id, else around its runtime call."""
        args = kernel.get("args", {})
        if args.get("External id") in self.by_external:
            return self.by_external[args["External id"]]
        runtime = self.runtime_by_corr.get(args.get("correlation"))
        return self.parent[runtime] if runtime is not None else None

    def kernel_phase(self, kernel: dict[str, Any]) -> str:
        """The phase of a device event: ``communication`` for a collective's kernel, else its launcher's label."""
        if is_comm(kernel["name"]):
            return COMM
        op = self.launcher(kernel)
        return self.label(op) if op is not None else UNLABELED

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
