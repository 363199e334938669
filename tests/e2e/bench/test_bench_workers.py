"""The worker benchmark runs end to end on CPU at the tiny shape and prints its TSV table.

ZeRO-3 (decoder layers as leaf modules) with the worker, the bare DeepSpeed loop and FSDP2
(``fully_shard`` on gloo, reducing once a step and after every micro-batch), each in its own pair of rank processes;
``--profile`` profiles one more worker update on rank 0.
"""

from __future__ import annotations

import os
import subprocess
import sys


def test_bench_tiny_shape_prints_rows_and_profiles_the_worker_update(tmp_path):
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "repro.bench.workers", "--shape", "tiny", "--cases", "zero3", "--steps", "1",
           "--warmup", "0", "--seq", "32", "--workdir", str(tmp_path), "--out", str(tmp_path / "bench.tsv"),
           "--timeout", "100", "--runners", "worker,bare,fsdp2,fsdp2_each", "--profile", str(tmp_path / "prof")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=330)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (tmp_path / "bench.tsv").read_text().splitlines()
    assert lines[0].split("\t") == ["case", "runner", "step_s", "tokens_per_s_per_gpu", "max_allocated_gb",
                                    "max_reserved_gb", "worker_vs_bare", "vs_fsdp2", "optimizer_on", "params_on",
                                    "vs_fsdp2_each"]
    rows = {tuple(line.split("\t")[:2]): line.split("\t") for line in lines[1:]}
    assert set(rows) == {("fsdp2", "fsdp2"), ("fsdp2_each", "fsdp2_each"), ("zero3", "worker"), ("zero3", "bare")}
    for row in rows.values():
        assert float(row[2]) > 0 and float(row[3]) > 0 and float(row[4]) > 0
        assert float(row[7]) > 0 and float(row[10]) > 0 and row[8:10] == ["device", "device"]
    assert float(rows[("zero3", "worker")][6]) > 0
    assert rows[("fsdp2", "fsdp2")][7] == rows[("fsdp2_each", "fsdp2_each")][10] == "1.000"
    assert [line.rstrip("\t") for line in proc.stdout.strip().splitlines()] == [line.rstrip("\t") for line in lines]
    # --profile: one more worker update, rank 0 under the profiler; the other runners are not profiled
    assert [p.name for p in (tmp_path / "prof").iterdir()] == ["zero3_worker_r0"]
    folder = tmp_path / "prof" / "zero3_worker_r0"
    assert sorted(p.name for p in folder.glob("*.trace.json")) == ["step2_rank0.trace.json"]  # warmup 0 + 1 step + 1
    phases = {line.split(" | ")[0].strip("| *"): line.split(" | ") for line in (folder / "phases.md").read_text().splitlines()
              if line.startswith("| ")}
    # ZeRO-3 gathers the partitioned weights and reduce-scatters gradients on gloo within the update
    assert float(phases["communication"][1]) > 0 and float(phases["optimizer"][1]) > 0
