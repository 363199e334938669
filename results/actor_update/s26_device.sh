#!/usr/bin/env bash
# Issue 35, session 26, one H200: FlashAttention-4 behind aten's flash ops with repro's own glue
# (repro/workers/fa4_kernels.py: FA2's causal window in FA4's terms, FA4's leading results, its own backward, in place
# of torch 2.11's glue, which refused the backward in session 25). First the GPU parity test
# (tests/gpu_e2e/test_varlen_gpu.py: FA4's packed and dense attention and gradients against an fp32 reference, held to
# 2x FA2's error + 2^-8), then form C with --infer in fresh processes, fa4 and torch alternated (fa4 first: if it
# fails, the call says so early) while the call's time lasts. One result line per process is appended as it ends, so a
# cut call keeps what ran. PROFILE_FIRST=N: the first N processes add one profiled update and log-prob pass
# (--profile; their phases.md come back), IMPLS the order of processes.
# Wheels as in session 25 (results/actor_update/s25_device.sh's header): call 1 carries [".whl4", ".whl"]:
#   mkdir -p /tmp/chunks && cp .whl4/* /tmp/chunks/ &&
#     python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
# call 2 carries [".whl5"]: OUT=$OUT bash results/actor_update/s26_device.sh
# (.whl4/.whl5 from `bash scripts/fa4_wheels.sh`; with results/, fixtures/ and repro/data/tiny_policy_weights/ in the
# tree .whl5 does not fit in one call's 64 MiB, so they are moved aside, all but this script and device_env.sh, while
# the calls run: the test and the bench read none of them.)
set -u
START=$(date +%s)
BUDGET=${BUDGET:-560}
W=/tmp/s26_work
mkdir -p "$W"
bash scripts/fa4_install.sh  # the payload, once per warm machine (inline when session 26 ran it: the same steps)
source results/actor_update/device_env.sh
export PYTHONPATH=$PYTHONPATH:/tmp/site/nvidia_cutlass_dsl/dsl_packages
python3 - >> "$O/env.txt" 2>&1 <<'PY'
import importlib.metadata as md
for d in ("flash-attn-4", "nvidia-cutlass-dsl", "cuda-bindings", "einops"):
    try: print(d, md.version(d))
    except md.PackageNotFoundError: print(d, "missing")
PY
REPRO_GPU_TESTS=1 timeout 240 python3 -m pytest -q -s -p no:cacheprovider tests/gpu_e2e/test_varlen_gpu.py \
  > "$O/gpu_test.txt" 2>&1
echo "gpu test rc=$? at $(( $(date +%s) - START )) s" | tee -a "$O/summary.txt"
grep -E "relative error|passed|failed" "$O/gpu_test.txt" >> "$O/summary.txt"
i=0
for impl in ${IMPLS:-fa4 torch fa4 torch fa4 torch}; do
  left=$(( BUDGET - ($(date +%s) - START) ))
  [ $left -gt 100 ] || { echo "stopped before $impl: ${left} s left" >> "$O/summary.txt"; break; }
  i=$((i + 1))
  prof=()
  [ $i -le "${PROFILE_FIRST:-0}" ] && prof=(--profile "$W/prof_$i")
  OMP_NUM_THREADS=1 timeout $left python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 \
    --min-response 1 --micro 16 --gas 4 --workdir "$W/${impl}_$i" --cases rmpad_compiled --rounds 1 --steps 3 \
    --budget 32768 --checkpointing off --adam fused --infer --flash-attention "$impl" --out "$W/t_$i.tsv" \
    "${prof[@]}" > "$W/log_$i.txt" 2>&1
  rc=$?
  echo "$i $impl rc=$rc at $(( $(date +%s) - START )) s $(grep -h '^# round' "$W/log_$i.txt")" | tee -a "$O/summary.txt"
  [ $rc -eq 0 ] || tail -30 "$W/log_$i.txt" >> "$O/summary.txt"
  for f in "$W/${impl}_$i"/run_*/rmpad_compiled_*.json; do echo "$i $impl $(cat "$f")"; done >> "$O/results.jsonl"
  for d in "$W/prof_$i"/*/; do [ -f "$d/phases.md" ] && cp "$d/phases.md" "$O/phases_${i}_${impl}_$(basename "$d").md"; done
done
