"""Issue 35, session 34: the host's time in form C's timed updates on one H100 (budget 8,192, ZeRO-1, FA2), from the
py-spy samples of `raw/s34_h100/call2/spy_raw.txt.gz` (`py-spy record --subprocesses --nonblocking --rate 250
--format raw`, README "Session 34"). Prints the table that section quotes:

    python results/actor_update/s34_pyspy_table.py results/actor_update/raw/s34_h100/call2/spy_raw.txt.gz

py-spy drops a thread's idle samples (waiting on the GPU in a CUDA call counts as busy: the driver spins), and the raw
format merges threads: the main thread's stacks pass through the bench's `_timed`, the autograd engine's device thread's
(the backward: compiled layers' backward graphs, DeepSpeed's gradient hooks) start at its own root. Stacks inside
torch.compile's compilation are left out (the first update compiles).
"""

from __future__ import annotations

import collections
import gzip
import sys

RATE_HZ = 250
TIMED_UPDATES = 10  # the bench's --steps
UPDATES_WITH_BACKWARD = 11  # the warm-up update and the timed ones (no --profile, no --host-ops in this run)
COMPILING = ("convert_frame", "compile_fx", "codecache", "async_compile", "symbolic_convert")

MAIN = [  # (row, a frame the stack holds), first match wins; all under ActorWorker.update_policy
    ("packing: the mask's copy to the host (a device wait)", "pack (repro/workers/packing.py:109)"),
    ("compiled decoder layers, forward (dynamo, AOT wrappers, generated code, launches)",
     "GradientCheckpointingLayer.__call__"),
    ("log-prob chunks, forward", "token_log_probs"),
    ("DeepSpeed's step (grad norm, overflow test, Adam, timer's synchronize)", "RoleEngine.end_update"),
    ("DeepSpeed's backward call (autograd's wait excluded: idle)", "RoleEngine.backward_micro"),
    ("the rest of the model's forward (embedding, rotary, norm, LM head)", "RoleEngine.forward"),
    ("the rest of the micro-batch (packing, slots, loss)", "RoleEngine.train_mini_batch"),
    ("planning (mini- and micro-batches)", "update_mini_batches"),
]
BACKWARD = [
    ("compiled decoder layers, backward", "CompiledFunction.backward"),
    ("log-prob chunks, backward", "_TokenLogProb.backward"),
    ("DeepSpeed's gradient hooks", "deepspeed/runtime/zero"),
]


def main(path: str) -> None:
    main_rows, bwd_rows = collections.Counter(), collections.Counter()
    for line in gzip.open(path, "rt"):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or any(k in stack for k in COMPILING):
            continue
        n = int(count)
        if "_timed" in stack:
            if "ActorWorker.update_policy" not in stack:
                continue  # the timed log-prob passes
            rows, table = MAIN, main_rows
        elif "BackwardCFunction.apply" in stack or "grad_handling_hook" in stack:
            rows, table = BACKWARD, bwd_rows
        else:
            continue  # start-up, model build, the compile workers
        table[next((row for row, frame in rows if frame in stack), "other")] += n
    for title, rows, table, updates in (("main thread, timed updates", MAIN, main_rows, TIMED_UPDATES),
                                        ("autograd's device thread (backward)", BACKWARD, bwd_rows, UPDATES_WITH_BACKWARD)):
        total = sum(table.values())
        print(f"| {title} | samples | ms an update |\n| --- | ---: | ---: |")
        for row in [r for r, _ in rows] + ["other"]:
            print(f"| {row} | {table[row]} | {1000 * table[row] / RATE_HZ / updates:.1f} |")
        print(f"| **all** | {total} | {1000 * total / RATE_HZ / updates:.1f} |\n")


if __name__ == "__main__":
    main(sys.argv[1])
