"""One RL step of one rank under ``torch.profiler`` (``trainer.profile_steps``), its time labelled by phase.

The workers own the device work, so the profiler runs in the rank's process, not the driver's:
the driver's timers say how long each phase took, this says which operators and launches the time
went to. Each listed step leaves, per rank, ``step<N>_rank<R>.txt`` (the top operators by device
time and by CPU time, with call counts: a launch-bound step shows thousands of calls of a few
microseconds each) and ``step<N>_rank<R>.trace.json`` (Chrome / Perfetto).

Phase labels (issue 35; read back by ``repro.bench.profile_phases``). While a profiler runs:

- the models given to :meth:`StepProfiler.start` carry forward pre/post hooks that open and close a
  ``repro::<phase>`` ``record_function`` range around each attention block (``*.self_attn``; a
  ``*Rotary*`` module counts as attention), MLP (``*.mlp``), ``lm_head``, embedding
  (``nn.Embedding``) and norm (a class named ``*Norm*``); the hooks are removed by
  :meth:`StepProfiler.stop`. The pre-hook is registered last and the post-hook
  first, so DeepSpeed ZeRO-3's own hooks (parameter fetch before, release after) stay outside
  the range: their time is the parent's. A recomputed forward (activation checkpointing) calls
  the same modules during backward, so it opens the same ranges there. A module whose call runs
  compiled (``nn.Module.compile``: ``model.compile_layers``) gets no hooks, nor do the modules inside
  it: a range opened inside compiled code is not recorded, and with the hooks there the profiled pass
  compiled again on an H200 (torch 2.11, inductor: 933 ms of a log-prob pass, session 22 of
  ``results/actor_update/README.md``; without them, session 23, nothing), while torch 2.13's CPU build
  drops them silently. Their time is labelled from the regions dynamo marks itself
  (``repro.bench.trace_events``: ``compiled_layers``);
- :func:`phase` opens ``repro::logprob`` (``repro.workers.logprob.token_log_probs``) and
  ``repro::optimizer`` (``RoleEngine``'s ``engine.step()``) ranges; with no profiler running it
  returns a null context (no ``record_function`` at all).

Backward ops are not inside these ranges; the analysis gives each the label of the forward op
with its sequence number.

Imports torch only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

ROWS = 40  # operators listed per table: enough to see past the top few without burying them
PREFIX = "repro::"
"""Name prefix of every phase range: ``repro::attention``, ``repro::mlp``, ..."""

_active = 0  # profilers running in this process (phase() records only while one is)


def phase(name: str) -> contextlib.AbstractContextManager[Any]:
    """A ``repro::<name>`` range while a :class:`StepProfiler` runs, else a null context."""
    return torch.profiler.record_function(PREFIX + name) if _active else contextlib.nullcontext()


def module_phase(name: str, module: torch.nn.Module) -> str | None:
    """The phase of a module named ``name`` (its path in the model), or None for an unlabelled one."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "self_attn":
        return "attention"
    if leaf == "mlp":
        return "mlp"
    if leaf == "lm_head":
        return "lm_head"
    if isinstance(module, torch.nn.Embedding):
        return "embedding"
    if "Norm" in type(module).__name__:
        return "norm"
    if "Rotary" in type(module).__name__:  # the positions' cos / sin, computed for the attention blocks
        return "attention"
    return None


def compiled_modules(model: torch.nn.Module) -> set[int]:
    """Ids of the modules of ``model`` whose calls run compiled, and of every module inside one."""
    return {id(inner) for m in model.modules() if getattr(m, "_compiled_call_impl", None) is not None
            for inner in m.modules()}


def label_modules(models: Iterable[torch.nn.Module]) -> list[Any]:
    """Install the phase hooks on every labelled module of ``models`` outside compiled calls; returns the
    hook handles."""
    handles: list[Any] = []
    seen: set[int] = set()
    for model in models:
        compiled = compiled_modules(model)
        for name, module in model.named_modules():
            label = module_phase(name, module)
            if label is None or id(module) in seen or id(module) in compiled:
                continue
            seen.add(id(module))
            open_ranges: list[Any] = []  # one per call in flight (a module re-entered opens a second)

            def pre(_mod, _args, label=label, open_ranges=open_ranges):
                rf = torch.profiler.record_function(PREFIX + label)
                rf.__enter__()
                open_ranges.append(rf)

            def post(_mod, _args, _out, open_ranges=open_ranges):
                if open_ranges:
                    open_ranges.pop().__exit__(None, None, None)

            handles.append(module.register_forward_pre_hook(pre))
            handles.append(module.register_forward_hook(post, prepend=True, always_call=True))
    return handles


class StepProfiler:
    """Starts on ``start(step)``, writes the step's tables and trace on ``stop()``."""

    def __init__(self, out_dir: str | Path, rank: int) -> None:
        self.out_dir, self.rank = Path(out_dir), rank
        self._prof: torch.profiler.profile | None = None
        self._step = 0
        self._hooks: list[Any] = []

    @property
    def stem(self) -> Path:
        """``<out_dir>/step<N>_rank<R>``: the trace is ``<stem>.trace.json``, the tables ``<stem>.txt``."""
        return self.out_dir / f"step{self._step}_rank{self.rank}"

    def start(self, step: int, models: Iterable[torch.nn.Module] = ()) -> None:
        """Profile from here to :meth:`stop`; ``models`` get the phase hooks meanwhile."""
        global _active
        if self._prof is not None:
            raise RuntimeError(f"profiler of step {self._step} still running when step {step} starts")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(activities=activities, record_shapes=False, with_stack=False)
        self._prof.__enter__()
        self._step = step
        self._hooks = label_modules(models)
        _active += 1

    def stop(self) -> Path:
        """Ends the profile; returns the text file written."""
        global _active
        if self._prof is None:
            raise RuntimeError("profiler stopped without a start")
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        _active -= 1
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        stem = self.stem
        events = prof.key_averages()
        device_key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        text = [f"step {self._step}, rank {self.rank}: top {ROWS} operators by self device time",
                events.table(sort_by=device_key, row_limit=ROWS),
                f"top {ROWS} operators by CPU time (including children)",
                events.table(sort_by="cpu_time_total", row_limit=ROWS)]
        path = stem.with_suffix(".txt")
        path.write_text("\n".join(text) + "\n")
        prof.export_chrome_trace(str(stem) + ".trace.json")
        return path
