"""One RL step of one rank under ``torch.profiler`` (``trainer.profile_steps``).

The workers own the device work, so the profiler runs in the rank's process, not the driver's:
the driver's timers say how long each phase took, this says which operators and launches the time
went to. Each listed step leaves, per rank, ``step<N>_rank<R>.txt`` (the top operators by device
time and by CPU time, with call counts: a launch-bound step shows thousands of calls of a few
microseconds each) and ``step<N>_rank<R>.trace.json`` (Chrome / Perfetto).

Imports torch only.
"""

from __future__ import annotations

from pathlib import Path

import torch

ROWS = 40  # operators listed per table: enough to see past the top few without burying them


class StepProfiler:
    """Starts on ``start(step)``, writes the step's tables and trace on ``stop()``."""

    def __init__(self, out_dir: str | Path, rank: int) -> None:
        self.out_dir, self.rank = Path(out_dir), rank
        self._prof: torch.profiler.profile | None = None
        self._step = 0

    def start(self, step: int) -> None:
        if self._prof is not None:
            raise RuntimeError(f"profiler of step {self._step} still running when step {step} starts")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(activities=activities, record_shapes=False, with_stack=False)
        self._prof.__enter__()
        self._step = step

    def stop(self) -> Path:
        """Ends the profile; returns the text file written."""
        if self._prof is None:
            raise RuntimeError("profiler stopped without a start")
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        stem = self.out_dir / f"step{self._step}_rank{self.rank}"
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
