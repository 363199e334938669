"""One pass of a worker under torch.profiler, with its batch's shape beside the trace and its ``phases.md``.

The ``--profile`` of the rmpad and worker benchmarks: a pass (an update, or a log-prob pass) runs once more
after the timed ones, so the timed figures stay unprofiled, with the phase hooks of
:class:`repro.workers.profiling.StepProfiler` on the model. Beside the trace go ``<stem>.shape.json`` (the model
shape and token counts the FLOP count reads, and whether the pass is forward only) and ``phases.md``, the report of
:mod:`repro.bench.profile_phases` (time per phase beside its ideal at the device's peak, the GPU's idle time by
host op, the kernels by kind). In a multi-rank run every rank runs the pass (its collectives need them all) and
only the ranks given ``out_dir`` profile it. Imports :mod:`repro.bench.profile_phases`, :mod:`repro.rl.mfu` and
:mod:`repro.workers.profiling`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def batch_counts(shape: Any, batch: dict) -> dict[str, Any]:
    """What the FLOP count reads of a padded batch: the shape, real tokens, the sum of squared sample lengths
    (attention) and the response tokens (the LM head's positions)."""
    from repro.bench import profile_phases

    lengths = batch["attention_mask"].sum(1).tolist()
    return {"shape": profile_phases.shape_dict(shape), "tokens": int(sum(lengths)),
            "sq_tokens": int(sum(n * n for n in lengths)), "lm_tokens": int(batch["response_mask"].sum())}


def profile_pass(run: Callable[[], Any], out_dir: str | Path | None, title: str, module: Any, step: int,
                 device: Any, counts: dict[str, Any], forward_only: bool = False) -> str:
    """Run ``run()`` once; with ``out_dir``, under the profiler, writing the trace, its shape file and
    ``phases.md`` there. Returns the report ("" without ``out_dir``: a rank that only takes part)."""
    if out_dir is None:
        run()
        return ""
    from repro.bench import profile_phases
    from repro.rl.mfu import device_name, device_peak_flops
    from repro.workers.profiling import StepProfiler

    profiler = StepProfiler(out_dir, rank=0)
    profiler.start(step, models=[module])
    run()
    profiler.stop()
    trace = profiler.stem.with_suffix(".trace.json")
    meta = {**counts, "forward_only": forward_only}
    profile_phases.meta_path(trace).write_text(json.dumps(meta, indent=1) + "\n")
    text = profile_phases.report(trace, meta, device_peak_flops(device_name(device)) / 1e12)
    (profiler.out_dir / "phases.md").write_text(f"{title}, {profiler.stem.name}\n\n{text}")
    return text
