#!/usr/bin/env bash
# Issue 35, session 34, one GPU: where the host's time goes in form C's update at four micro-batches (budget 8,192,
# ZeRO-1, FA2), sampled by py-spy on the GPU machine itself (torch 2.11's profiler there records no Python frame,
# README "Session 31"), and whether inductor's C++ wrapper (TORCHINDUCTOR_CPP_WRAPPER=1: the compiled layers' kernels
# launched from generated C++ instead of generated Python) shortens it; then the CPU suites on this machine's CPU.
# STAGE=host: ENTRIES (default "spy:base cppw base cppw base"), each a fresh process of form C (session 31's command,
#   --zero-stage 1 --budget 8192 --flash-attention torch --infer, 10 timed updates); "spy:" runs it under
#   `py-spy record --subprocesses --nonblocking --format raw` (samples the bench without stopping it); base = no
#   setting, cppw = TORCHINDUCTOR_CPP_WRAPPER=1. Back: summary.txt, results.jsonl, pyspy_*.txt, case_logs.txt.
# STAGE=install / STAGE=cpu: results/actor_update/s31_device.sh's (the Ray wheel's halves, verl's wheels, the suites).
# .pyspy (ignored, one wheel, 2.9 MB): python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12
#   --implementation cp --platform manylinux2014_x86_64 -d .pyspy py-spy==0.4.3 (add /.pyspy/ to .git/info/exclude).
# Payload, calls back to back on one warm machine (the tree is ~24 MB; a call carries 64 MiB in all):
#   1. carry [".whl", ".pyspy"]: python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site
#        .whl/*.whl .pyspy/*.whl && REPRO_COMMIT=... STAGE=host OUT=$OUT bash results/actor_update/s34_device.sh
#   2. carry [".whl2"]: mkdir -p /tmp/chunks && cp .whl2/* /tmp/chunks/
#   3. carry [".whl3"]: STAGE=install bash results/actor_update/s31_device.sh && REPRO_COMMIT=...
#        STAGE=cpu SUITES="unit slow distributed" OUT=$OUT bash results/actor_update/s31_device.sh
#   4. carry [".whl6"]: STAGE=install bash results/actor_update/s31_device.sh && REPRO_COMMIT=...
#        STAGE=cpu SUITES=e2e VERL=1 OUT=$OUT bash results/actor_update/s31_device.sh
set -u
START=$(date +%s)
BUDGET=${BUDGET:-540}
W=/tmp/s34_work
mkdir -p "$W"
source results/actor_update/device_env.sh
echo "commit ${REPRO_COMMIT:-unknown}" >> "$O/env.txt"
SPY=/tmp/site/bin/py-spy
i=0
for entry in ${ENTRIES:-spy:base cppw base cppw base}; do
  spy=""; [ "${entry#spy:}" != "$entry" ] && spy=1 && entry=${entry#spy:}
  case "$entry" in
    base) setting="" ;;
    cppw) setting="TORCHINDUCTOR_CPP_WRAPPER=1" ;;
    *) echo "unknown entry $entry" >> "$O/summary.txt"; continue ;;
  esac
  left=$(( BUDGET - ($(date +%s) - START) ))
  [ $left -gt 110 ] || { echo "stopped before $entry: ${left} s left" >> "$O/summary.txt"; break; }
  i=$((i + 1))
  name="${i}_${entry}${spy:+_spy}"
  cmd=(python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 --min-response 1 --micro 16
       --gas 4 --zero-stage 1 --workdir "$W/$name" --cases rmpad_compiled --rounds 1 --steps 10 --budget 8192
       --checkpointing off --adam fused --infer --flash-attention torch --out "$W/t_$name.tsv")
  if [ -n "$spy" ]; then
    cmd=("$SPY" record --subprocesses --nonblocking --rate 250 --format raw --output "$O/pyspy_$name.txt" -- "${cmd[@]}")
  fi
  env $setting OMP_NUM_THREADS=1 timeout $left "${cmd[@]}" > "$W/$name.txt" 2>&1
  rc=$?
  echo "$i $name ($setting) rc=$rc at $(( $(date +%s) - START )) s $(grep -h '^# round' "$W/$name.txt")" | tee -a "$O/summary.txt"
  [ $rc -eq 0 ] || tail -30 "$W/$name.txt" >> "$O/summary.txt"
  run=$(ls -td "$W/$name"/run_* 2>/dev/null | head -1)
  for f in "$run"/rmpad_compiled_*.json; do [ -f "$f" ] && echo "$name $(cat "$f")"; done >> "$O/results.jsonl"
  { echo "===== $name"; cat "$W/$name.txt"; cat "$run"/rmpad_compiled_*.log 2>/dev/null; } >> "$O/case_logs.txt"
done
