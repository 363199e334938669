#!/usr/bin/env bash
# The GPU gate on any machine with 2+ CUDA GPUs and a CUDA torch: what .github/workflows/gpu_e2e.yml runs.
#
#   bash scripts/gpu_e2e.sh [pytest args...]
#
# Builds (once) a venv on top of the machine's Python, so its CUDA torch is reused and nothing
# downloads a CPU torch, installs repro with its dev extras, then runs `nox -s gpu_e2e` with
# REPRO_REQUIRE_GPU=1: a machine without the GPUs fails instead of skipping. Each gate case writes
# its record (gate.json, summary.tsv, metrics.tsv, curves.png) under $REPRO_GATE_OUT/<case>/.
#
#   REPRO_GPU_PYTHON  interpreter with the CUDA torch (default: python3)
#   REPRO_GPU_VENV    venv directory (default: .venv-gpu)
#   REPRO_GATE_OUT    where the records go (default: results/gpu_gate/run-<UTC date>)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${REPRO_GPU_PYTHON:-python3}
venv=${REPRO_GPU_VENV:-.venv-gpu}
export REPRO_GATE_OUT=${REPRO_GATE_OUT:-$PWD/results/gpu_gate/run-$(date -u +%Y%m%dT%H%M%SZ)}
"$py" -c 'import torch; assert torch.cuda.is_available(), "this interpreter has no CUDA torch"' || {
  echo "gpu_e2e: $py has no CUDA torch; set REPRO_GPU_PYTHON to the interpreter that has one" >&2
  exit 2
}
[[ -x "$venv/bin/python" ]] || "$py" -m venv --system-site-packages "$venv"
# DS_BUILD_OPS=0: DeepSpeed JIT-builds the ops it needs on first use.
DS_BUILD_OPS=0 "$venv/bin/python" -m pip install -q -e '.[dev]'
# NVLink multicast stays off (the multi-rank harness sets it per rank too; Ray workers inherit this).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export REPRO_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
mkdir -p "$REPRO_GATE_OUT"
echo "gpu_e2e: records under $REPRO_GATE_OUT"
"$venv/bin/python" -m nox -s gpu_e2e -- "$@"
