#!/usr/bin/env bash
# Issue 35, session 27, one H200: why FlashAttention-4's faster kernels did not make the update faster (session 26).
# 1. The GPU parity test of the varlen path (tests/gpu_e2e/test_varlen_gpu.py; repro/workers/varlen.py's call moved into
#    varlen.packed this session), while the two CPU tests session 26 mended run on this machine's CPU
#    (scripts/cpu_suite_elsewhere.sh, -k: the preflight and the host-ops/profile tests) in the background.
# 2. python -m repro.bench.attention_calls: host and device time per packed attention call, FA2 then FA4, at form C's
#    micro-batches (budget 32768: one of 26,979 tokens) and at budget 16384 (two).
# 3. Form C with --infer and 20 timed updates per process (session 26 timed 3, and its processes differed by more than
#    the kernels' saving), fa4 and torch alternated while the call's time lasts; each row now has every update's
#    garbage-collection pauses (repro/bench/gc_pauses.py). GC=freeze runs them with gc.freeze() after the warm-up.
# Wheels as in session 26 (results/actor_update/s26_device.sh's header): call 1 carries [".whl4", ".whl"]:
#   mkdir -p /tmp/chunks && cp .whl4/* /tmp/chunks/ &&
#     python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
# call 2 carries [".whl5"]: OUT=$OUT bash results/actor_update/s27_device.sh (results/, fixtures/ and
# repro/data/tiny_policy_weights/ moved aside, all but this script and device_env.sh, as in session 26).
# SKIP_TEST=1 skips step 1, SKIP_CALLS=1 step 2 (a second call on a warm machine).
set -u
START=$(date +%s)
BUDGET=${BUDGET:-570}
W=/tmp/s27_work
mkdir -p "$W"
bash scripts/fa4_install.sh
source results/actor_update/device_env.sh
export PYTHONPATH=$PYTHONPATH:/tmp/site/nvidia_cutlass_dsl/dsl_packages
python3 - >> "$O/env.txt" 2>&1 <<'PY'
import importlib.metadata as md
for d in ("flash-attn-4", "nvidia-cutlass-dsl", "cuda-bindings"):
    try: print(d, md.version(d))
    except md.PackageNotFoundError: print(d, "missing")
PY
if [ -z "${SKIP_TEST:-}" ]; then
  # TORCH_CUDA_ARCH_LIST as the image sets it (device_env.sh exports 9.0): the value the preflight test met in session 26
  ( TORCH_CUDA_ARCH_LIST=9.0a PYTHON=python3 JOBS=4 OUT=$O/cpu bash scripts/cpu_suite_elsewhere.sh \
      unit slow -- -k "preflight or host_ops or profile_phases" > "$O/cpu_tests.txt" 2>&1 ) &
  cpu=$!
  REPRO_GPU_TESTS=1 timeout 240 python3 -m pytest -q -s -p no:cacheprovider tests/gpu_e2e/test_varlen_gpu.py \
    > "$O/gpu_test.txt" 2>&1
  echo "gpu test rc=$? at $(( $(date +%s) - START )) s" | tee -a "$O/summary.txt"
  grep -E "relative error|passed|failed" "$O/gpu_test.txt" >> "$O/summary.txt"
  wait $cpu
  echo "cpu tests rc=$? at $(( $(date +%s) - START )) s" | tee -a "$O/summary.txt"
  tail -15 "$O/cpu_tests.txt" >> "$O/summary.txt"
fi
if [ -z "${SKIP_CALLS:-}" ]; then
  for budget in 32768 16384; do
    OMP_NUM_THREADS=1 timeout 200 python3 -m repro.bench.attention_calls --impls torch,fa4 --budget $budget --hold 1 \
      --out "$O/attention_calls_$budget.tsv" > "$O/attention_calls_$budget.txt" 2>&1
    echo "attention_calls $budget rc=$? at $(( $(date +%s) - START )) s" | tee -a "$O/summary.txt"
    grep "^#" "$O/attention_calls_$budget.txt" >> "$O/summary.txt"
  done
fi
i=0
for impl in ${IMPLS:-fa4 torch fa4 torch fa4 torch}; do
  left=$(( BUDGET - ($(date +%s) - START) ))
  [ $left -gt 100 ] || { echo "stopped before $impl: ${left} s left" >> "$O/summary.txt"; break; }
  i=$((i + 1))
  OMP_NUM_THREADS=1 timeout $left python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 \
    --min-response 1 --micro 16 --gas 4 --workdir "$W/${impl}_$i" --cases rmpad_compiled --rounds 1 --steps 20 \
    --budget 32768 --checkpointing off --adam fused --infer --flash-attention "$impl" --gc "${GC:-default}" \
    --out "$W/t_$i.tsv" > "$W/log_$i.txt" 2>&1
  rc=$?
  echo "$i $impl rc=$rc at $(( $(date +%s) - START )) s $(grep -h '^# round' "$W/log_$i.txt")" | tee -a "$O/summary.txt"
  [ $rc -eq 0 ] || tail -30 "$W/log_$i.txt" >> "$O/summary.txt"
  for f in "$W/${impl}_$i"/run_*/rmpad_compiled_*.json; do echo "$i $impl $(cat "$f")"; done >> "$O/results.jsonl"
done
