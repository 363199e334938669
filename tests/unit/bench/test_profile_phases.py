"""``repro.bench.profile_phases``: time per phase of a profiled step, on hand-built Chrome traces
(exact attribution) and, marked slow, on one real profiled update of the tiny model on CPU."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from repro.bench import profile_phases
from repro.bench.host_ops import NO_FRAME, profiler_gives_python_frames
from repro.bench.profile_phases import attribute, flops, main, table
from repro.bench.rmpad import make_batch
from repro.bench.shapes import model_config
from repro.bench.trace_events import EVALUATE, Trace
from repro.rl.mfu import achieved_flops
from tests.subprocess_env import pythonpath

A, B = 10, 20  # thread ids: the main thread, and another (an autograd device thread on a GPU)


def op(name: str, ts: float, dur: float, tid: int = A, cat: str = "cpu_op", **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {k.replace("_", " "): v for k, v in args.items()}}


def flow(kind: str, ident: int, ts: float, tid: int = A) -> dict:
    return {"ph": kind, "cat": "fwdbwd", "name": "fwdbwd", "id": ident, "pid": 1, "tid": tid, "ts": ts}


def kernel(name: str, ts: float, dur: float, stream: int = 7, **args) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {k.replace("_", " "): v for k, v in args.items()}}


def gpu_trace() -> dict:
    """A forward matmul in ``repro::attention``, its backward, a gradient hook's copy, an unlabelled
    reduction, an NCCL all-reduce overlapping the copy, the optimizer's kernel, and gaps."""
    return {"traceEvents": [
        op("repro::attention", 0, 10, cat="user_annotation", External_id=1),
        op("aten::mm", 1, 6, External_id=2, Sequence_number=5, Fwd_thread_id=0),
        op("cudaLaunchKernel", 2, 2, cat="cuda_runtime", correlation=100, External_id=2),
        op("aten::sum", 12, 2, External_id=3, Sequence_number=6, Fwd_thread_id=0),  # the loss: unlabelled
        op("cudaLaunchKernel", 12.5, 1, cat="cuda_runtime", correlation=104, External_id=3),
        op(EVALUATE + " MmBackward0", 20, 10, External_id=4, Sequence_number=5, Fwd_thread_id=1),
        op("MmBackward0", 21, 8, External_id=5, Sequence_number=5, Fwd_thread_id=1),
        op("aten::mm", 22, 5, External_id=6),
        op("cudaLaunchKernel", 23, 1, cat="cuda_runtime", correlation=101, External_id=6),
        op(EVALUATE + " torch::autograd::AccumulateGrad", 31, 3, External_id=7),
        op("cudaLaunchKernel", 32, 1, cat="cuda_runtime", correlation=102),
        op("repro::optimizer", 40, 10, cat="user_annotation", External_id=8),
        op("aten::_foreach_add_", 41, 4, External_id=9),
        op("cudaLaunchKernel", 42, 1, cat="cuda_runtime", correlation=103, External_id=9),
        flow("s", 1, 1), flow("f", 1, 21),
        kernel("sm90_gemm_fwd", 5, 10, External_id=2, correlation=100),        # attention  [5, 15]
        kernel("reduce_kernel", 16, 2, External_id=3, correlation=104),        # unlabeled  [16, 18]
        kernel("sm90_gemm_bwd", 25, 10, External_id=6, correlation=101),       # attention  [25, 35] (backward)
        kernel("copy_kernel", 33, 4, correlation=102),                         # grad hook  [33, 37], runtime link only
        kernel("ncclDevKernel_AllReduce_Sum_f32", 36, 10, stream=9, correlation=105),  # comm [36, 46]
        kernel("multi_tensor_apply_kernel", 46, 6, External_id=9, correlation=103),    # optimizer [46, 52]
    ]}


def test_a_gpu_trace_gives_each_kernel_the_phase_of_its_launching_op_and_the_gaps_to_idle() -> None:
    result = attribute(gpu_trace())
    assert result["mode"] == "device"
    assert result["step_us"] == 52  # first CPU op to the last kernel's end
    assert result["phases"] == {
        "attention": 10 + 8 + 1,   # forward kernel; backward kernel, half of [33, 35] shared with the copy
        "grad_accumulate": 1 + 2,  # its half of [33, 35], then [35, 37] (the NCCL kernel beside it from 36)
        "communication": 9,        # [37, 46]: only where nothing else runs
        "optimizer": 6,
        "unlabeled": 2,
        "idle/launch": 5 + 1 + 7,  # [0, 5], [15, 16], [18, 25]
    }
    assert result["overlapped_comm_us"] == 1  # [36, 37]
    assert sum(result["phases"].values()) == result["step_us"]


def test_a_kernel_without_its_launching_op_is_unlabeled_not_lost() -> None:
    trace = gpu_trace()
    trace["traceEvents"].append(kernel("orphan", 52, 3, External_id=999, correlation=999))
    result = attribute(trace)
    assert result["phases"]["unlabeled"] == 2 + 3
    assert result["step_us"] == 55


def cpu_trace() -> dict:
    """No kernels: an MLP forward and its backward on thread A; a forward recomputed on thread B
    under the same sequence number (per-thread counters) just before A's backward, and its own
    backward later on A, which only the fwdbwd flows tie to B."""
    return {"traceEvents": [
        op("repro::mlp", 0, 10, cat="user_annotation"),
        op("aten::mm", 2, 4, Sequence_number=3, Fwd_thread_id=0),
        op("repro::attention", 7, 4, tid=B, cat="user_annotation"),
        op("aten::mm", 8, 2, tid=B, Sequence_number=3, Fwd_thread_id=0),
        op(EVALUATE + " MulBackward0", 12, 8, Sequence_number=3, Fwd_thread_id=1),
        op("MulBackward0", 13, 6, Sequence_number=3, Fwd_thread_id=1),
        op("repro::optimizer", 22, 8, cat="user_annotation"),
        op("aten::add", 34, 2),
        op(EVALUATE + " MmBackward0", 46, 4, Sequence_number=3, Fwd_thread_id=2),
        op("MmBackward0", 47, 2, Sequence_number=3, Fwd_thread_id=2),
        flow("s", 1, 2), flow("f", 1, 13), flow("s", 2, 8, tid=B), flow("f", 2, 47),
    ]}


def test_a_cpu_trace_attributes_self_time_and_backward_ops_by_sequence_number_on_their_forward_thread() -> None:
    result = attribute(cpu_trace())
    assert result["mode"] == "cpu"
    assert result["step_us"] == 50
    # [7, 10] runs on both threads: split evenly
    assert result["phases"] == {"mlp": 7 + 1.5 + 8, "attention": 1.5 + 1 + 4, "optimizer": 8, "unlabeled": 2,
                                "idle/launch": 1 + 2 + 4 + 10}
    assert Trace(cpu_trace()).fwd_thread == {1: (1, A), 2: (1, B)}


def test_without_flows_a_backward_op_takes_the_forward_op_of_its_own_thread() -> None:
    trace = cpu_trace()
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    phases = attribute(trace)["phases"]
    # the backward at 46 is B's forward's, but with no flow to say so it takes A's
    assert (phases["mlp"], phases["attention"]) == (7 + 1.5 + 8 + 4, 1.5 + 1)


SHAPE = {"model_type": "qwen3", "hidden_size": 4, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": None, "intermediate_size": 8, "vocab_size": 10}


def test_the_flop_columns_split_the_mfu_formula_by_phase() -> None:
    # tokens 8, squared lengths 34 (3 and 5), LM head on 4 positions: see tests/unit/rl/test_mfu.py
    f = flops(SimpleNamespace(**SHAPE), tokens=8, sq_tokens=34, lm_tokens=4)
    # attention's scores term alone, 6 * 34 * 2 * 2 * 1 = 816 (the compiled layers' attention kernels' ideal)
    assert f == {"attention": 3120, "mlp": 4608, "lm_head": 960, "embedding": 0, "attention_scores": 816,
                 "mfu_total": 3120 + 4608 + 2 * 1920}
    text = table(attribute(gpu_trace()), f, peak_tflops=1e-6)  # 1 MFLOP/s: 3120 FLOPs take 3.12 ms at peak
    lines = text.splitlines()
    assert lines[0] == "| phase | device ms | share | GFLOP | ideal ms | ideal / measured |"
    assert "| attention | 0.019 | 36.5% | 3.12e-06 | 3.12 | 16421.1% |" in lines
    assert "| logprob | 0.000 | 0.0% | - | - | - |" in lines  # a phase the step lacks still has its row
    assert "| idle/launch | 0.013 | 25.0% | - | - | - |" in lines
    assert "| **step** | 0.052 | 100.0% | 8.688e-06 | 8.688 | 16707.7% |" in lines
    assert "- MFU formula's count (embedding and LM head on every token): 1.157e-05 GFLOP" in text


def compiled_trace() -> dict:
    """Compiled decoder layers (no hooks inside): an op in dynamo's region and its backward, tied to it by
    sequence number; a compiled function inside ``repro::logprob``, whose range wins."""
    return {"traceEvents": [
        op("Torch-Compiled Region: 0/0", 0, 10),
        op("CompiledFunction", 1, 8, Sequence_number=4, Fwd_thread_id=0),
        op("repro::logprob", 12, 6, cat="user_annotation"),
        op("Torch-Compiled Region: 1/0", 13, 4),
        op("aten::mm", 14, 2),
        op(EVALUATE + " CompiledFunctionBackward", 20, 10, Sequence_number=4, Fwd_thread_id=1),
        op("CompiledFunctionBackward", 21, 8, Sequence_number=4, Fwd_thread_id=1),
        flow("s", 1, 1), flow("f", 1, 21),
    ]}


def test_compiled_regions_label_the_layers_inside_them_unless_a_phase_range_encloses_them() -> None:
    phases = attribute(compiled_trace())["phases"]
    # [0, 10] the layers' forward, [20, 30] their backward; [12, 18] log-probs, compiled or not
    assert phases == {"compiled_layers": 10 + 10, "logprob": 6, "idle/launch": 2 + 2}
    # the FLOP columns: the compiled row carries attention + MLP, which get no rows of their own
    f = flops(SimpleNamespace(**SHAPE), tokens=8, sq_tokens=34, lm_tokens=4)
    lines = table(attribute(compiled_trace()), f, peak_tflops=1e-6).splitlines()
    assert "| compiled_layers | 0.020 | 66.7% | 7.728e-06 | 7.728 | 38640.0% |" in lines
    assert not any(line.startswith(("| attention ", "| mlp ")) for line in lines)
    assert "| **step** | 0.030 | 100.0% | 8.688e-06 | 8.688 | 28960.0% |" in lines  # the step's FLOPs unchanged


def test_a_forward_only_pass_counts_a_third_of_every_phases_flops() -> None:
    full = flops(SimpleNamespace(**SHAPE), tokens=8, sq_tokens=34, lm_tokens=4)
    forward = flops(SimpleNamespace(**SHAPE), tokens=8, sq_tokens=34, lm_tokens=4, forward_only=True)
    assert forward == {k: v / 3 for k, v in full.items()}


def test_the_cli_reads_shape_and_counts_from_the_json_beside_the_trace(tmp_path: Path, capsys) -> None:
    trace = tmp_path / "step3_rank0.trace.json"
    trace.write_text(json.dumps(gpu_trace()))
    assert profile_phases.meta_path(trace) == tmp_path / "step3_rank0.shape.json"
    profile_phases.meta_path(trace).write_text(json.dumps({"shape": SHAPE, "tokens": 8, "sq_tokens": 34}))
    assert main([str(trace), "--lm-tokens", "4", "--peak-tflops", "1e-6", "--out", str(tmp_path / "phases.md")]) == 0
    out = capsys.readouterr().out
    assert "| lm_head | 0.000 | 0.0% | 9.6e-07 | 0.96 | - |" in out
    assert (tmp_path / "phases.md").read_text() == out


@pytest.mark.slow
def test_one_real_update_of_the_tiny_model_on_cpu_is_split_into_its_phases(tmp_path: Path) -> None:
    """rmpad's CPU smoke run with ``--profile``: hooks, ranges and the analysis on a real trace."""
    cmd = [sys.executable, "-m", "repro.bench.rmpad", "--shape", "tiny", "--prompt", "32", "--response", "32",
           "--min-response", "4", "--steps", "1", "--warmup", "1", "--rounds", "1", "--cases", "padded",
           "--checkpointing", "off", "--infer", "--profile", str(tmp_path / "profile"), "--workdir", str(tmp_path / "work"), "--host-ops"]
    root = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=pythonpath(root))
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = sorted((tmp_path / "work").glob("run_*"))  # this command's results in a folder of its own
    assert len(runs) == 1 and (runs[0] / "padded_0.json").is_file(), sorted((tmp_path / "work").iterdir())
    # every timed update is kept (one here: --steps 1), and the median printed is theirs
    result_row = json.loads((runs[0] / "padded_0.json").read_text())
    timed = result_row["update_s"]
    assert len(timed) == 1 and "(median of 1: " in done.stderr, done.stderr[-2000:]
    # each timed update's and pass's garbage collections kept beside its time (repro.bench.gc_pauses)
    assert result_row["gc"] == "default" and len(result_row["gc_s"]) == len(result_row["gc_full"]) == 1, result_row
    assert len(result_row["infer_gc_s"]) == 1 and "GC (default) " in done.stderr, done.stderr[-2000:]
    # --checkpointing off reached the model the engine trained
    assert result_row["checkpointing"] is False and result_row["optimizer"] == "AdamW", result_row
    # MFU: verl's formula over the batch's real tokens at the median update, against a CPU's 448 GFLOP/s
    tiny = model_config("tiny")
    batch_args = SimpleNamespace(micro=4, gas=4, prompt=32, response=32, min_response=4)  # the command's defaults and flags
    lengths = make_batch(batch_args, tiny.vocab_size)["attention_mask"].sum(1).tolist()
    expected = achieved_flops(tiny, lengths, result_row["step_s"]) / 448e9
    assert result_row["mfu"] == pytest.approx(expected, rel=1e-9), (result_row["mfu"], expected)
    assert f"MFU {expected:.1%}" in done.stderr, done.stderr[-2000:]
    # --infer: the old-log-prob pass timed too, its MFU a third of the formula (verl's perf/mfu/actor_infer)
    assert len(result_row["infer_each_s"]) == 1 and result_row["infer_s"] > 0, result_row
    infer = achieved_flops(tiny, lengths, result_row["infer_s"]) / 448e9 / 3
    assert result_row["infer_mfu"] == pytest.approx(infer, rel=1e-9) and "log-prob pass " in done.stderr
    folder = tmp_path / "profile" / "padded_0"
    trace_path = folder / "step3_rank0.trace.json"
    raw = json.loads(trace_path.read_text())
    result = attribute(raw)
    phases = result["phases"]
    for name in ("attention", "mlp", "lm_head", "logprob", "optimizer"):
        assert phases.get(name, 0) > 0, (name, phases)
    assert sum(phases.values()) == pytest.approx(result["step_us"], rel=1e-6)
    # backward ranges get the labels of their forward ops, most of their time a module's or log-probs'
    t = Trace(raw)
    backward: dict[str, float] = {}
    for i, e in enumerate(t.cpu):
        if e["name"].startswith(EVALUATE) and (t.parent[i] is None or not t.cpu[t.parent[i]]["name"].startswith(EVALUATE)):
            backward[t.label(i)] = backward.get(t.label(i), 0.0) + e["dur"]
    for name in ("attention", "mlp", "lm_head", "logprob"):
        assert backward.get(name, 0) > 0, (name, backward)
    assert backward.get("unlabeled", 0) < 0.2 * sum(backward.values()), backward
    text = (folder / "phases.md").read_text()
    assert "| **step** |" in text and "| attention |" in text and "GFLOP" in text
    print(text)
    # --infer with --profile: the log-prob pass profiled too (a forward: no optimizer), its ideal a third of the FLOPs
    infer_folder = tmp_path / "profile" / "padded_0_infer"
    assert json.loads(next(infer_folder.glob("*.shape.json")).read_text())["forward_only"] is True
    infer_phases = attribute(json.loads(next(infer_folder.glob("*.trace.json")).read_text()))["phases"]
    assert infer_phases.get("optimizer", 0) == 0 and infer_phases.get("mlp", 0) > 0, infer_phases
    assert "| **step** |" in (infer_folder / "phases.md").read_text()
    # --host-ops: the same update's dispatches, far more than the model's modules (every layer's
    # forward, backward and optimizer ops), each issuer's share printed; device syncs on CUDA only
    header, row = [line.split("\t") for line in done.stdout.rstrip("\n").splitlines()[-2:]]
    counts = dict(zip(header, row, strict=True))
    assert int(counts["host_ops"]) > 200 and counts["host_syncs"] == "", counts
    issuers = re.search(r"host ops by issuer (\{.*\})", done.stderr)
    assert issuers, done.stderr
    by = ast.literal_eval(issuers[1])
    if profiler_gives_python_frames():
        assert {"deepspeed", "repro", "transformers", "autograd"} <= set(by) and NO_FRAME not in by, done.stderr
    else:  # the GPU machine's profiler (torch 2.11, Python 3.12): said so, not counted as torch's own ops
        assert set(by) == {NO_FRAME, "autograd"}, done.stderr
