#!/usr/bin/env bash
# Issue 35, session 34's change measured (for the next one-GPU lease): the update at four micro-batches with no
# device wait inside the micro-batch loop (the masks' host copies, host-computed varlen boundaries, DeepSpeed's
# throughput timer off) against the tree before it, alternated in fresh processes on one machine, then the GPU test
# of the change. Session 34's py-spy samples (README "Session 34") put 25.6 ms an update in the mask's copy to the
# host and 7.6 ms in DeepSpeed's timer's synchronize, on a host busy ~270 ms an update beside ~270 ms of kernels.
# "before" is this tree with `raw/s34_h100/no_waits.patch` (session 34's changes, `git diff d919218 <commit> -- repro`)
# reversed, in /tmp/before; "after" is this tree. The GPU tests: the packed forward's, and inductor's compiled layers
# against fp64 in both scopes.
# ENTRIES (default "after before stack after before stack"): form C at --zero-stage 1 --budget 8192 (session 31's
# command, FA2, 10 timed updates, --host-ops: its device syncs and their sites), each a fresh process; "stack" is
# "after" with --compile-scope stack (model.compile_scope: the whole decoder stack one compiled region, session 34's
# other lever: the compiled layers cost the host 162 ms an update, mostly per-call wrappers).
# Back: summary.txt, results.jsonl (the bench's rows, host_syncs and host_sync_sites among them), case_logs.txt,
# gpu_test.txt.
# Payload: carry [".whl"]: python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl &&
#   REPRO_COMMIT=... OUT=$OUT bash results/actor_update/s34b_device.sh
set -u
START=$(date +%s)
BUDGET=${BUDGET:-560}
W=/tmp/s34b_work
mkdir -p "$W"
source results/actor_update/device_env.sh
echo "commit ${REPRO_COMMIT:-unknown}" >> "$O/env.txt"
rm -rf /tmp/before && mkdir -p /tmp/before && cp -r repro results /tmp/before/ &&
  (cd /tmp/before && patch -s -R -p1 < results/actor_update/raw/s34_h100/no_waits.patch) ||
  { echo "could not build /tmp/before" | tee -a "$O/summary.txt"; exit 1; }
i=0
for entry in ${ENTRIES:-after before stack after before stack}; do
  scope=layer
  case "$entry" in
    after) tree=$PWD ;;
    before) tree=/tmp/before ;;
    stack) tree=$PWD; scope=stack ;;
    *) echo "unknown entry $entry" >> "$O/summary.txt"; continue ;;
  esac
  left=$(( BUDGET - ($(date +%s) - START) ))
  [ $left -gt 100 ] || { echo "stopped before $entry: ${left} s left" >> "$O/summary.txt"; break; }
  i=$((i + 1))
  name="${i}_${entry}"
  (cd "$tree" && PYTHONPATH=/tmp/site:$tree OMP_NUM_THREADS=1 timeout $left python3 -m repro.bench.rmpad \
    --shape qwen3-0.6b --prompt 256 --response 512 --min-response 1 --micro 16 --gas 4 --zero-stage 1 \
    --workdir "$W/$name" --cases rmpad_compiled --rounds 1 --steps 10 --budget 8192 --checkpointing off --adam fused \
    --infer --flash-attention torch --host-ops $([ "$scope" = stack ] && echo --compile-scope stack) \
    --out "$W/t_$name.tsv") > "$W/$name.txt" 2>&1
  rc=$?
  echo "$i $name rc=$rc at $(( $(date +%s) - START )) s $(grep -h '^# round' "$W/$name.txt" | grep -v '#  ')" | tee -a "$O/summary.txt"
  [ $rc -eq 0 ] || tail -30 "$W/$name.txt" >> "$O/summary.txt"
  run=$(ls -td "$W/$name"/run_* 2>/dev/null | head -1)
  for f in "$run"/rmpad_compiled_*.json; do [ -f "$f" ] && echo "$name $(cat "$f")"; done >> "$O/results.jsonl"
  { echo "===== $name"; cat "$W/$name.txt"; } >> "$O/case_logs.txt"
done
left=$(( BUDGET - ($(date +%s) - START) ))
REPRO_GPU_TESTS=1 REPRO_REQUIRE_GPU=1 timeout $(( left > 30 ? left : 30 )) python3 -m pytest \
  tests/gpu_e2e/test_workers_gpu.py tests/gpu_e2e/test_layer_compile_gpu.py -m gpu -k "packed_micro_batch or fp64" -q \
  -p no:cacheprovider > "$O/gpu_test.txt" 2>&1
echo "gpu test rc=$? at $(( $(date +%s) - START )) s" | tee -a "$O/summary.txt"
