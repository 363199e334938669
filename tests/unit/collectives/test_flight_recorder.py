"""Reading PyTorch Flight Recorder dumps (the pickle ``_dump_fr_trace`` returns) into the record model.

The dumps here are built with the keys and value shapes of a real torch 2.13 gloo dump (version
"2.10" schema); the distributed tests also analyse a dump made live from gloo ranks.
"""

from __future__ import annotations

import pickle

import pytest

from repro.collectives_trace import analyze

_TORCH = "/venv/lib/python3.11/site-packages/torch/distributed/"


def _entry(seq: int, op: str, size: list[int], dtype: str, line: int, state: str = "completed") -> dict:
    return {
        "record_id": seq - 1,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": f"nccl:{op}",
        "time_created_ns": 1_000_000 * seq,
        "input_sizes": [size],
        "input_dtypes": [dtype],
        "output_sizes": [size],
        "output_dtypes": [dtype],
        "state": state,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": state == "completed",
        "timeout_ms": 600000,
        "is_p2p": False,
        "thread_id": "1",
        "thread_name": "python3",
        "frames": [
            {"filename": _TORCH + "distributed_c10d.py", "line": 3245, "name": op},
            {"filename": _TORCH + "c10d_logger.py", "line": 83, "name": "wrapper"},
            {"filename": "/job/train.py", "line": line, "name": "step"},
            {"filename": "/job/train.py", "line": 99, "name": "<module>"},
        ],
    }


def _dump(entries: list[dict]) -> dict:
    return {
        "version": "2.10",
        "comm_lib_version": "2.27.3",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": len(entries),
                "last_started_collective": -1,
                "last_completed_collective": len(entries) - 1,
            }
        },
        "entries": entries,
    }


def _write(tmp_path, rank: int, dump: dict) -> None:
    (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump))


def test_flight_recorder_size_mismatch_is_found_with_user_frames_as_sites(tmp_path):
    _write(
        tmp_path,
        0,
        _dump(
            [
                _entry(1, "all_reduce", [4], "Float", 10),
                _entry(2, "all_reduce", [1], "Float", 20, "scheduled"),
            ]
        ),
    )
    _write(
        tmp_path,
        1,
        _dump(
            [
                _entry(1, "all_reduce", [4], "Float", 10),
                _entry(2, "all_reduce", [440467456], "BFloat16", 30, "scheduled"),
            ]
        ),
    )
    traces, d = analyze(tmp_path)
    assert sorted(traces) == [0, 1] and traces[0].groups == {"0": (0, 1)}
    assert d.kind == "mismatch" and d.differing == ["numel", "dtype"]
    assert (d.call_a.numel, d.call_b.numel) == (1, 440467456)
    assert (d.call_a.dtype, d.call_b.dtype) == ("float32", "bfloat16")
    assert d.call_a.site.endswith("train.py:20 step") and d.call_b.site.endswith("train.py:30 step")
    assert d.call_a.t_end is None  # scheduled, never completed


def test_flight_recorder_missing_call_is_reported_as_stopped(tmp_path):
    _write(
        tmp_path,
        0,
        _dump([_entry(1, "all_reduce", [4], "Float", 10), _entry(2, "broadcast", [4], "Float", 11)]),
    )
    _write(tmp_path, 1, _dump([_entry(1, "all_reduce", [4], "Float", 10)]))
    _, d = analyze(tmp_path)
    assert d.kind == "stopped" and d.rank_b == 1 and d.call_a.op == "broadcast"


def test_flight_recorder_dump_without_rank_in_name_is_a_clear_error(tmp_path):
    (tmp_path / "dump.pkl").write_bytes(pickle.dumps(_dump([])))
    with pytest.raises(ValueError, match="cannot tell the rank"):
        analyze(tmp_path)


def test_empty_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no rank\\*.jsonl trace files and no Flight Recorder dumps"):
        analyze(tmp_path)
