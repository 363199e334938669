"""``repro.bench.profile_idle``: the GPU's idle time split by the host's innermost op and its phase,
on hand-built Chrome traces whose answer is worked out by hand in each test."""

from __future__ import annotations

import json

import pytest

from repro.bench import profile_phases
from repro.bench.profile_idle import NO_OP, idle_host, idle_intervals, idle_table

A, B = 10, 20  # two host threads


def op(name: str, ts: float, dur: float, tid: int = A, cat: str = "cpu_op") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}}


def kernel(ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": ts, "dur": dur, "args": {}}


def sync_bound_trace() -> dict:
    """Kernels on [0, 10] and [30, 40]; in the gap the host syncs (aten::item around a stream sync) and
    then runs the optimizer's Python and one launch; nothing is recorded on [40, 44]."""
    return {"traceEvents": [
        op("aten::mm", 0, 2),
        kernel(0, 10),
        op("aten::item", 10, 10),
        op("cudaStreamSynchronize", 12, 8, cat="cuda_runtime"),
        op("repro::optimizer", 20, 10, cat="user_annotation"),
        op("aten::add_", 21, 8),
        kernel(30, 10),
        op("aten::mm", 44, 1),
    ]}


def test_idle_intervals_are_the_step_less_the_union_of_device_events():
    device = [kernel(0, 10), kernel(5, 10), kernel(30, 2)]
    assert idle_intervals(device, 0, 40) == [(15, 30), (32, 40)]
    assert idle_intervals(device, -3, 12) == [(-3, 0)]


def test_idle_time_goes_to_the_innermost_op_and_its_phase():
    result = idle_host(sync_bound_trace())
    # idle: [10, 30] and [40, 45]: 25 us
    assert result["idle_us"] == 25 and result["step_us"] == 45
    assert result["by_op"] == pytest.approx({"aten::item": 2, "cudaStreamSynchronize": 8, "repro::optimizer": 2,
                                             "aten::add_": 8, NO_OP: 4, "aten::mm": 1})
    assert result["by_phase"] == pytest.approx({"unlabeled": 11, "optimizer": 10, NO_OP: 4})
    assert sum(result["by_op"].values()) == pytest.approx(result["idle_us"])


def test_an_idle_instant_is_split_between_the_threads_running_an_op():
    trace = {"traceEvents": [op("aten::mm", 0, 1), kernel(0, 10), op("aten::item", 10, 10),
                             op("MmBackward0", 14, 4, tid=B), kernel(20, 1)]}
    result = idle_host(trace)
    assert result["by_op"] == pytest.approx({"aten::item": 8, "MmBackward0": 2})


def test_a_trace_without_kernels_has_no_idle_table():
    assert idle_host({"traceEvents": [op("aten::mm", 0, 5)]}) is None
    assert idle_table(None) == ""


def test_the_table_ranks_ops_and_sums_the_rest(tmp_path):
    text = idle_table(idle_host(sync_bound_trace()), top=2)
    assert text.startswith("GPU idle 0.025 ms of the 0.045 ms step")
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[2].startswith("| cudaStreamSynchronize | 0.008 |") or rows[2].startswith("| aten::add_ | 0.008 |")
    assert "| (the other 4) | 0.009 | 36.0% |" in text
    assert "| unlabeled | 0.011 | 44.0% |" in text
    path = tmp_path / "step5_rank0.trace.json"
    path.write_text(json.dumps(sync_bound_trace()))
    assert idle_table(idle_host(sync_bound_trace())) in profile_phases.report(path)  # the phase report carries it
