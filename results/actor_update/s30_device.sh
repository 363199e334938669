#!/usr/bin/env bash
# Issue 35, session 30, one H100 (no H100 figure of the update or the log-prob pass had the fused overflow test, the K/V
# change, FA4 or session 28's compiled-layer mend; sessions 17-27 ran on H200s):
# 1. The GPU tests of the paths timed below on this GPU: tests/gpu_e2e/test_varlen_gpu.py (FA2 and FA4 against fp32)
#    and tests/gpu_e2e/test_layer_compile_gpu.py (compiled layers on the varlen path compile in the first update only).
# 2. python -m repro.bench.attention_calls at form C's budget and at two smaller ones (FA4's host time per call where
#    micro-batches are a few thousand tokens: session 27 measured 32768 and 16384 only).
# 3. Form C (--cases rmpad_compiled --budget 32768 --checkpointing off --adam fused --infer, 20 timed updates a process)
#    in fresh processes, alternated: IMPLS lists KERNELS:TREE, KERNELS torch (FA2) or fa4, TREE new (this tree) or old
#    (this tree with repro/workers/varlen.py as it was before session 28's mend, the file at 96b8fbe; git history
#    holds it and the device's copy of the tree has no .git, so it goes untracked with the tree, made before the calls:
#    git show 96b8fbe:repro/workers/varlen.py > results/actor_update/s30_varlen_96b8fbe.py). Every process runs under TORCH_LOGS=recompiles,graph_breaks; its summary line counts both.
#    FORMC_BUDGET sets the token budget (8192: four micro-batches an update, FA4's host time then shows or not).
# Wheels as in sessions 26-27: call 1 carries [".whl4", ".whl"]:
#   mkdir -p /tmp/chunks && cp .whl4/* /tmp/chunks/ &&
#     python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
# call 2 carries [".whl5"]: OUT=$OUT bash results/actor_update/s30_device.sh (results/, fixtures/ and
# repro/data/tiny_policy_weights/ moved aside, all but this script, device_env.sh and s30_varlen_96b8fbe.py: .whl5 and
# the whole tree pass one call's 64 MiB). SKIP_TEST=1 skips step 1, SKIP_CALLS=1 step 2 (later calls, warm machine).
set -u
START=$(date +%s)
BUDGET=${BUDGET:-570}
W=/tmp/s30_work
mkdir -p "$W"
bash scripts/fa4_install.sh
source results/actor_update/device_env.sh
DSL=/tmp/site/nvidia_cutlass_dsl/dsl_packages
export PYTHONPATH=$PYTHONPATH:$DSL
python3 - >> "$O/env.txt" 2>&1 <<'PY'
import importlib.metadata as md
for d in ("flash-attn-4", "nvidia-cutlass-dsl", "cuda-bindings"):
    try: print(d, md.version(d))
    except md.PackageNotFoundError: print(d, "missing")
PY
echo "commit ${REPRO_COMMIT:-unknown}" >> "$O/env.txt"
OLD=/tmp/s30_old_tree  # the same tree, varlen.py before the mend
if [[ "${IMPLS:-fa4:new torch:new fa4:old}" == *:old* ]] && [ ! -d $OLD ]; then
  [ -f results/actor_update/s30_varlen_96b8fbe.py ] || {
    echo "results/actor_update/s30_varlen_96b8fbe.py missing: git show 96b8fbe:repro/workers/varlen.py > it" >&2; exit 2; }
  mkdir -p $OLD && cp -r repro $OLD/
  cp results/actor_update/s30_varlen_96b8fbe.py $OLD/repro/workers/varlen.py
fi
if [ -z "${SKIP_TEST:-}" ]; then
  REPRO_GPU_TESTS=1 REPRO_REQUIRE_GPU=1 timeout 300 python3 -m pytest -q -s -p no:cacheprovider \
    tests/gpu_e2e/test_varlen_gpu.py tests/gpu_e2e/test_layer_compile_gpu.py > "$O/gpu_test.txt" 2>&1
  echo "gpu tests rc=$? at $(( $(date +%s) - START )) s" | tee -a "$O/summary.txt"
  grep -E "relative error|passed|failed" "$O/gpu_test.txt" >> "$O/summary.txt"
fi
if [ -z "${SKIP_CALLS:-}" ]; then
  for budget in ${CALL_BUDGETS:-32768 8192 4096}; do
    OMP_NUM_THREADS=1 timeout 120 python3 -m repro.bench.attention_calls --impls torch,fa4 --budget $budget --hold 1 \
      --out "$W/attention_calls_$budget.tsv" > "$W/attention_calls_$budget.txt" 2>&1
    echo "attention_calls $budget rc=$? at $(( $(date +%s) - START )) s" | tee -a "$O/summary.txt"
    grep "^#" "$W/attention_calls_$budget.txt" >> "$O/summary.txt"
    { echo "## budget $budget"; cat "$W/attention_calls_$budget.tsv"; } >> "$O/attention_calls.tsv"
  done
fi
i=0
for entry in ${IMPLS:-fa4:new torch:new fa4:old}; do
  impl=${entry%%:*}; tree=${entry##*:}
  left=$(( BUDGET - ($(date +%s) - START) ))
  [ $left -gt 100 ] || { echo "stopped before $entry: ${left} s left" >> "$O/summary.txt"; break; }
  i=$((i + 1))
  root=$PWD; [ "$tree" = old ] && root=$OLD
  log="$W/log_${CALL:-c}_$i.txt"
  ( cd "$root" && PYTHONPATH=/tmp/site:$root:$DSL OMP_NUM_THREADS=1 TORCH_LOGS=recompiles,graph_breaks timeout $left \
      python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 --min-response 1 --micro 16 --gas 4 \
      --workdir "$W/${impl}_${tree}_${CALL:-c}_$i" --cases rmpad_compiled --rounds 1 --steps ${STEPS:-20} \
      --budget ${FORMC_BUDGET:-32768} --checkpointing off --adam fused --infer --flash-attention "$impl" \
      --out "$W/t_$i.tsv" ) > "$log" 2>&1
  rc=$?
  # The case runs in a subprocess of the bench, whose output (TORCH_LOGS' lines too) goes to the case's own log in its
  # run folder; calls 2-5 grepped $log instead, so their recompiles=0 graph_break_lines=0 counted nothing.
  case_logs=("$W/${impl}_${tree}_${CALL:-c}_$i"/run_*/rmpad_compiled_*.log)
  recompiles=$(cat "${case_logs[@]}" | grep -c "Recompiling function"); breaks=$(cat "${case_logs[@]}" | grep -ci "graph break")
  echo "$i $impl $tree rc=$rc at $(( $(date +%s) - START )) s recompiles=$recompiles graph_break_lines=$breaks" \
    "$(grep -h '^# round' "$log")" | tee -a "$O/summary.txt"
  [ $rc -eq 0 ] || tail -30 "$log" >> "$O/summary.txt"
  for f in "$W/${impl}_${tree}_${CALL:-c}_$i"/run_*/rmpad_compiled_*.json; do
    echo "${CALL:-c} $i $impl $tree $(cat "$f")"; done >> "$O/results.jsonl"
  { echo "===== ${CALL:-c} $i $impl $tree"; cat "${case_logs[@]}" | grep -iE -A3 "recompil|graph break|triggered by" | head -${LOG_LINES:-40}; } >> "$O/compile_log.txt"
done
