"""Time per phase of one profiled step, beside each phase's ideal at peak (issue 35).

Reads a Chrome trace of :class:`repro.workers.profiling.StepProfiler` (``step<N>_rank<R>.trace.json``)
and prints a markdown table: phase, device ms (CPU ms on a trace with no GPU kernels), share of
the step, FLOPs, ideal ms at ``--peak-tflops`` and ideal / measured.

    python -m repro.bench.profile_phases TRACE.json --shape qwen3-0.6b --tokens N --sq-tokens M [--lm-tokens L]
    python -m repro.bench.profile_phases TRACE.json      # shape and counts from <stem>.shape.json beside it

Attribution (labels are the ``repro::<phase>`` ranges :mod:`repro.workers.profiling` opens; the
parsed trace and its labels are :class:`repro.bench.trace_events.Trace`'s):

- a CPU op takes the label of its innermost enclosing ``repro::`` range on its thread; an
  ``autograd::engine::evaluate_function:`` range met first on the way out (a backward op and its
  children) takes the label of the forward op with the same ``Sequence number`` on the forward
  thread (the profiler's ``fwdbwd`` flows map each "Fwd thread id" to a thread; an id no flow
  maps: the backward op's own thread, else any), the latest before it;
  an op named for a collective (``nccl``, ``gloo``, ``c10d::``, ``record_param_comms``) is
  ``communication``; ``AccumulateGrad`` (no sequence number) and the gradient hooks that run in
  it (DeepSpeed ZeRO-1/2's bucket copies) are ``grad_accumulate``; nothing: ``unlabeled``
  (the loss, DeepSpeed's Python between ops, ZeRO-3's parameter fetch). A recomputed forward (activation checkpointing) runs
  inside its backward but opens its module's range again, so it is labelled as a forward. An op that
  would be unlabelled inside a compiled region (dynamo's ``Torch-Compiled Region`` range: the decoder
  layers under ``model.compile_layers``, which carry no hooks) is ``compiled_layers``: attention, MLP
  and norms fused by the compiler, their split no longer the trace's to tell;
- a GPU kernel (also memcpy / memset) takes the label of the CPU op that launched it: the op
  with its ``External id``, else the op around the runtime call with its ``correlation``; a
  kernel whose name contains ``nccl`` is ``communication``;
- the step is the wall span from the first CPU op to the last op or kernel. Each instant of it
  goes to the phases of the device events (CPU mode: the ops' self time) running then, split
  evenly between them; communication gets only instants with no other event (overlapped
  communication is printed under the table); instants with none go to ``idle/launch``. So the
  rows sum to the step.

FLOPs of one forward + backward over the batch (a third of it for a forward-only pass: ``forward_only`` in the
meta), from ``repro.rl.mfu.flops_by_part`` (verl's MFU
terms split by part; ``T`` tokens = sum of lengths, ``S`` = sum of squared lengths, ``h`` hidden,
``L`` layers, ``a`` heads, ``d`` head dim, ``k`` KV heads, ``f`` MLP width, ``V`` vocabulary):

- attention: ``6 T L h (2 a d + 2 k d) + 6 S d a L`` (projections and scores);
- mlp: ``6 T L 3 h f``;
- compiled_layers (in place of attention and mlp when the step has that row): their sum;
- lm_head: ``6 T' V h`` with ``T'`` = ``--lm-tokens`` (the positions that need logits: the
  response tokens; default ``T``, which is what the MFU formula counts);
- embedding: 0 here (a gather); the MFU formula counts ``6 T V h`` for it, which the footer's
  MFU total includes;
- norm, logprob, optimizer, communication: no matmul FLOPs (memory-bound), no ideal given.

Ideal ms = FLOPs / peak. A recomputed forward (activation checkpointing) is work the ideal does
not count. Imports the standard library, :mod:`repro.bench.trace_events`, :mod:`repro.bench.profile_idle` and
:mod:`repro.bench.profile_kernels`;
``repro.rl.mfu`` (torch) and, for ``--shape NAME``,
``repro.bench.workers`` (transformers) only when FLOPs are asked for.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from repro.bench.profile_idle import idle_host, idle_table
from repro.bench.profile_kernels import kernel_table, phase_kernel_table
from repro.bench.trace_events import COMM, COMPILED, GRAD_ACC, UNLABELED, Trace

IDLE = "idle/launch"
ORDER = ("attention", "mlp", COMPILED, "norm", "embedding", "lm_head", "logprob", "optimizer", GRAD_ACC, COMM,
         UNLABELED, IDLE)
# flops()'s keys that are not a phase's FLOPs (a whole count, and a part of attention's)
NOT_PHASES = ("mfu_total", "attention_scores")
SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "intermediate_size", "vocab_size")


def attribute(trace: dict[str, Any] | Trace) -> dict[str, Any]:
    """``{"mode": "device" | "cpu", "step_us", "phases": {phase: us}, "overlapped_comm_us"}``."""
    t = Trace.of(trace)
    pieces: list[tuple[float, float, str]] = []
    if t.device:
        mode = "device"
        pieces.extend((k["ts"], k["ts"] + k["dur"], t.kernel_phase(k)) for k in t.device)
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
    from repro.bench.shapes import model_config

    return model_config(shape)


def shape_dict(config: Any) -> dict[str, Any]:
    """The keys of ``config`` the FLOP count reads (what the bench writes beside a trace)."""
    return {k: getattr(config, k, None) for k in SHAPE_KEYS}


def flops(config: Any, tokens: int, sq_tokens: int, lm_tokens: int | None = None,
          forward_only: bool = False) -> dict[str, float]:
    """FLOPs per phase (module docstring), ``"attention_scores"`` (attention's scores term, for the compiled layers'
    kernel kinds) and ``"mfu_total"``, the MFU formula's whole count; ``forward_only`` (a log-prob pass): a third
    of each, as verl's ``perf/mfu/actor_infer`` counts it."""
    from repro.rl.mfu import attention_score_flops, flops_by_part

    parts = flops_by_part(config, tokens, sq_tokens)
    if not parts:
        return {}
    scale = 1 / 3 if forward_only else 1.0
    per_token_head = parts["lm_head"] / tokens if tokens else 0.0
    out = {"attention": parts["attention"], "mlp": parts["mlp"],
           "attention_scores": attention_score_flops(config, sq_tokens),
           "lm_head": per_token_head * (tokens if lm_tokens is None else lm_tokens),
           "embedding": 0.0, "mfu_total": sum(parts.values())}
    return {k: v * scale for k, v in out.items()}


def _pct(x: float) -> str:
    """A share in percent: one decimal, or three significant digits below 0.1%."""
    return f"{x:.1%}" if x >= 1e-3 or x == 0 else f"{x * 100:.3g}%"


def table(result: dict[str, Any], phase_flops: dict[str, float] | None = None, peak_tflops: float = 989.0) -> str:
    """The markdown table of :func:`attribute`'s ``result`` (FLOP columns when ``phase_flops``)."""
    phase_flops = dict(phase_flops or {})
    step_ms = result["step_us"] / 1e3
    fused = COMPILED in result["phases"]
    if fused and "attention" in phase_flops:  # the layers' phases ran as one compiled region
        phase_flops[COMPILED] = phase_flops.pop("attention") + phase_flops.pop("mlp")
    unit = "device ms" if result["mode"] == "device" else "CPU ms"
    peak = peak_tflops * 1e12
    lines = [f"| phase | {unit} | share | GFLOP | ideal ms | ideal / measured |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    phases = result["phases"]
    always = ("lm_head", "logprob", "optimizer") + ((COMPILED,) if fused else ("attention", "mlp"))
    names = [p for p in ORDER if p in phases or p in always]
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
    total_f = sum(v for k, v in phase_flops.items() if k not in NOT_PHASES)
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
    """The table of one trace, then (device traces) what the host did while the GPU idled
    (:mod:`repro.bench.profile_idle`) and the kernels by kind (:mod:`repro.bench.profile_kernels`);
    ``meta``: ``{"shape": ..., "tokens", "sq_tokens", "lm_tokens"?}`` (or None)."""
    raw = json.loads(Path(trace_path).read_text())
    parsed = Trace(raw)  # once: the phases, the idle host and the compiled layers' kernels all read it
    result = attribute(parsed)
    phase_flops = None
    if meta and meta.get("shape") is not None and meta.get("tokens") is not None:
        phase_flops = flops(shape_config(meta["shape"]), int(meta["tokens"]), int(meta.get("sq_tokens") or 0),
                            meta.get("lm_tokens"), bool(meta.get("forward_only")))
    idle = idle_table(idle_host(parsed))
    kernels = kernel_table(raw)
    compiled = phase_kernel_table(parsed, COMPILED, compiled_ideals(phase_flops, peak_tflops))
    if compiled:
        compiled += ("\n\n- gemm's ideal: the layers' projections and MLP; attention's: the scores as verl counts them "
                     "(the whole square of each length; a causal kernel computes about half)")
    return (table(result, phase_flops, peak_tflops) + ("\n" + idle if idle else "") + ("\n\n" + kernels if kernels else "")
            + ("\n\n" + compiled + "\n" if compiled else ""))


def compiled_ideals(phase_flops: dict[str, float] | None, peak_tflops: float) -> dict[str, float]:
    """The compiled layers' ideal ms by kernel kind: matrix multiplies (projections, MLP) and attention (scores)."""
    if not phase_flops or "attention_scores" not in phase_flops:
        return {}
    to_ms = 1e3 / (peak_tflops * 1e12)
    scores = phase_flops["attention_scores"]
    return {"gemm": (phase_flops["attention"] - scores + phase_flops["mlp"]) * to_ms, "attention": scores * to_ms}


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
