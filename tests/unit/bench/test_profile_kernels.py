"""The step's kernels by kind (``repro.bench.profile_kernels``), on a hand-written trace."""

from __future__ import annotations

from repro.bench.profile_kernels import kernel_table, kind, phase_kernel_table


def _kernel(name: str, ts: float, dur: float, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7, "args": {}}


TRACE = {"traceEvents": [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 1, "pid": 1, "tid": 1, "args": {}},
    _kernel("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", 0, 4000),
    _kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 4000, 2000),
    _kernel("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, cutlass::bfloat16_t>>", 6000, 1500),
    _kernel("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", 7500, 1000),
    _kernel("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", 8500, 1000),
    _kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 8000, 500),
    _kernel("Memcpy DtoD (Device -> Device)", 9500, 250, cat="gpu_memcpy"),
    _kernel("void at::native::vectorized_elementwise_kernel<4>", 9750, 250),
]}


def test_each_kernel_gets_the_kind_its_name_says() -> None:
    kinds = [kind(e) for e in TRACE["traceEvents"][1:]]
    assert kinds == ["gemm", "gemm", "attention", "triton", "triton", "communication", "memcpy/memset", "other"]


def test_the_table_sums_device_time_by_kind_and_lists_the_longest_kernels() -> None:
    text = kernel_table(TRACE, top=2)
    lines = text.splitlines()
    # 10.5 ms of kernels in all (the all-reduce overlapping a triton kernel counts in full)
    assert "| gemm | 6.000 | 57.1% | 2 |" in lines
    assert "| attention | 1.500 | 14.3% | 1 |" in lines
    assert "| triton | 2.000 | 19.0% | 2 |" in lines
    assert "| communication | 0.500 | 4.8% | 1 |" in lines
    assert "| memcpy/memset | 0.250 | 2.4% | 1 |" in lines and "| other | 0.250 | 2.4% | 1 |" in lines
    top = lines[lines.index("| --- | ---: | ---: |") + 1:]
    assert top == ["| `nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT` | 4.000 | 1 |",
                   "| `sm90_xmma_gemm_bf16bf16_bf16f32` | 2.000 | 1 |"]
    assert "longest kernels (of 7)" in text


def test_a_trace_without_kernels_has_no_table() -> None:
    assert kernel_table({"traceEvents": TRACE["traceEvents"][:1]}) == ""


def _op(name: str, ts: float, dur: float, external: int | None = None, cat: str = "cpu_op") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1,
            "args": {} if external is None else {"External id": external}}


def _launched(name: str, ts: float, dur: float, external: int) -> dict:
    return {**_kernel(name, ts, dur), "args": {"External id": external}}


# Two ops inside dynamo's compiled region (the layers), one under the LM head's range: their kernels
COMPILED_TRACE = {"traceEvents": [
    _op("Torch-Compiled Region: 0/0", 0, 100),
    _op("aten::mm", 1, 10, external=1),
    _op("aten::_flash_attention_forward", 20, 10, external=2),
    _op("triton_poi_fused_add_0", 40, 5, external=3),
    _op("repro::lm_head", 200, 50, cat="user_annotation"),
    _op("aten::mm", 201, 10, external=4),
    _launched("nvjet_sm90_tst_128x288_NNT", 1, 3000, 1),
    _launched("nvjet_sm90_tst_128x288_TNT", 3001, 1000, 1),
    _launched("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", 4001, 4000, 2),
    _launched("triton_poi_fused_add_0", 8001, 2000, 3),
    _launched("nvjet_sm90_tst_192x208_lm_head", 10001, 9000, 4),
]}


def test_one_phases_kernels_by_kind_stand_beside_each_kinds_ideal() -> None:
    text = phase_kernel_table(COMPILED_TRACE, "compiled_layers", {"gemm": 2.0, "attention": 0.4})
    lines = text.splitlines()
    assert lines[0] == "| compiled_layers: kernel kind | device ms | share | kernels | ideal ms | ideal / measured |"
    # 10 ms of the layers' kernels; the LM head's 9 ms gemm is not theirs
    assert "| gemm | 4.000 | 40.0% | 2 | 2 | 50.0% |" in lines
    assert "| attention | 4.000 | 40.0% | 1 | 0.4 | 10.0% |" in lines
    assert "| triton | 2.000 | 20.0% | 1 | - | - |" in lines  # memory-bound: no ideal given
    assert len(lines) == 5  # kinds with no kernel in the phase get no row
    assert phase_kernel_table(COMPILED_TRACE, "optimizer") == ""
