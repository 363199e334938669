#!/usr/bin/env bash
# Issue 35's next one-H100 call (written in session 14, not yet run). Two questions, in order of need:
# 1. The order control of the A B B A runs: session 14's sync cuts measured slower in the middle runs, as session 13's
#    fused/eager runs did; B A A B of the same two trees says whether the order or the code did it.
# 2. Decoder layers under torch.compile (first their GPU test, tests/gpu_e2e/test_layer_compile_gpu.py) (the bench's rmpad_compiled case, repro/workers/layer_compile.py) against the
#    eager ones, alternating within one command (rmpad, compiled, rmpad, compiled, ...), at one 16,384-token
#    micro-batch and, in what is left of the call, at the default budget of 4,096: the time, the host operators and the graphs dynamo captured.
# Carry [".whl", ".ab_before"] (ab_device.sh's header says how to make .ab_before); each result lands in $OUT as soon
# as it exists (at most 8 files come back from a call: the per-run files go into one archive at the end).
# As one call:  bash results/actor_update/s14_device.sh
# Beside the 4-GPU runs, on a GPU they leave free until their jobs start (the private copy of the tree; .whl installed
# by an earlier call, .ab_before carried before the copy was made):
#   GPUS=3 SCRIPT_TIMEOUT=900 BUDGET_S=870 bash scripts/seed_scale.sh bg s14 script results/actor_update/s14_device.sh
set -u
[ -d /tmp/site/deepspeed ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD TORCH_CUDA_ARCH_LIST=9.0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
R=/tmp/s14_runs
mkdir -p "$O" "$R"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -m1 'Model name'
  python3 -c "import torch, transformers, deepspeed; print(torch.__version__, transformers.__version__, deepspeed.__version__)"
} > "$O/env.txt" 2>&1
REPRO_GPU_TESTS=1 REPRO_REQUIRE_GPU=1 timeout -k 10 240 python3 -m pytest tests/gpu_e2e/test_layer_compile_gpu.py -m gpu -q \
  -p no:cacheprovider > "$O/gpu_test.log" 2>&1  # inductor's layers against eager, both against fp64
ORDER="after before before after" OUT=$R/baab bash results/actor_update/ab_device.sh 16384 > "$O/baab.txt" 2>&1
for budget in 16384 0; do  # the second only in what is left of BUDGET_S (a call's 600 s; inductor's first compile: minutes?)
  left=$(( ${BUDGET_S:-570} - SECONDS ))
  [ "$left" -gt 90 ] || { echo "compile, budget $budget: not run ($left s left)" >> "$O/baab.txt"; continue; }
  timeout -k 10 "$left" python3 -m repro.bench.rmpad --shape qwen3-0.6b --cases rmpad,rmpad_compiled --rounds 3 \
    --budget "$budget" --host-ops --workdir /tmp/rmpad_work --out "$O/compile_b$budget.tsv" > "$R/compile_b$budget.log" 2>&1
  echo "compile, budget $budget: rc=$?" >> "$O/baab.txt"
  grep '^# round' "$R/compile_b$budget.log" > "$O/compile_b$budget.txt"  # s/update, graphs, issuers
done
tar -czf "$O/runs.tar.gz" --exclude='model_*' -C "$R" . -C / tmp/rmpad_work 2>/dev/null
cat "$O/baab.txt" "$O"/compile_b*.tsv
