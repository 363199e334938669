#!/usr/bin/env bash
# Issue 35, session 24, one H200: is the processes' spread of form C (sessions 15-23: a process at 0.27 s or at
# 0.38 s an update, the same kernels, more GPU idle while the host works) the host's intra-op thread pool?
# The bench's child inherits OMP_NUM_THREADS (unset here: torch starts one thread per core) while the trainer's
# ranks run with OMP_NUM_THREADS=1 (repro/cluster/worker_group.py). Six fresh processes, A B B A A B, A with
# OMP_NUM_THREADS unset, B with OMP_NUM_THREADS=1, each form C with --infer; the thread count is read back
# (intra_op_threads). One result line per process is appended as it ends, so a cut call keeps what ran.
# Carry [".whl"] (Ray not needed); one direct call:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   OUT=$OUT bash results/actor_update/s24_device.sh
set -u
W=/tmp/s24_work
mkdir -p "$W"
source results/actor_update/device_env.sh
{ lscpu | grep -E 'NUMA|^CPU\(s\)|Thread|Core|Socket'; nproc; } >> "$O/env.txt"
unset OMP_NUM_THREADS
i=0
for mode in A B B A A B; do
  i=$((i + 1))
  if [ "$mode" = B ]; then threads=(env OMP_NUM_THREADS=1); else threads=(env -u OMP_NUM_THREADS); fi
  "${threads[@]}" python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 --min-response 1 \
    --micro 16 --gas 4 --workdir "$W/${mode}_$i" --cases rmpad_compiled --rounds 1 --steps 3 --budget 32768 \
    --checkpointing off --adam fused --infer --out "$W/t_$i.tsv" > "$W/log_$i.txt" 2>&1
  rc=$?
  echo "$i $mode rc=$rc $(grep -h '^# round' "$W/log_$i.txt")" | tee -a "$O/summary.txt"
  [ $rc -eq 0 ] || tail -20 "$W/log_$i.txt" >> "$O/summary.txt"
  for f in "$W/${mode}_$i"/run_*/rmpad_compiled_*.json; do echo "$i $mode $(cat "$f")"; done >> "$O/results.jsonl"
done
