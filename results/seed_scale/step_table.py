"""The per-phase table of GRPO runs from their ``metrics.tsv`` (section 9 of this folder's README).

    python results/seed_scale/step_table.py RUN_DIR [RUN_DIR ...]

Medians over steps 2 onwards (step 1 carries vLLM's and the kernels' warm-up), peak memory over all steps, and per
run the steps whose score, response length, policy loss and entropy equal the first run's exactly (a different ZeRO
stage or hook layout must not change what the run learns; the gradient norm's reduction order may move its last
digits, so it is compared as the largest relative difference).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from repro.rl.metrics import MetricsLog

PHASES = ("timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor", "timing_s/update_weights")
PEAKS = ("perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb", "perf/nvml_memory_used_gb")
EXACT = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "actor/entropy")


def main(runs: list[Path]) -> None:
    first = MetricsLog(runs[0] / "metrics.tsv").rows
    head = ["run", "steps", *(k.split("/")[-1] for k in PHASES), *(k.split("/")[-1] for k in PEAKS),
            "exact steps", "grad_norm max rel diff"]
    print("| " + " | ".join(head) + " |\n|" + " --- |" * len(head))
    for run in runs:
        r = MetricsLog(run / "metrics.tsv").rows
        med = [f"{statistics.median(x[k] for x in r[1:]):.3f}" for k in PHASES]
        peak = [f"{max(x[k] for x in r):.2f}" for k in PEAKS]
        exact = sum(all(a[k] == b[k] for k in EXACT) for a, b in zip(first, r, strict=True))
        rel = max(abs(a["actor/grad_norm"] - b["actor/grad_norm"]) / abs(a["actor/grad_norm"])
                  for a, b in zip(first, r, strict=True))
        print(f"| {run.name} | {len(r)} | " + " | ".join(med + peak) + f" | {exact} of {len(r)} | {rel:.1e} |")


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
