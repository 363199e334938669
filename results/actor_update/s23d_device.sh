#!/usr/bin/env bash
# Issue 35, session 23, one H200: form C's update with repro's fused overflow test (F) and DeepSpeed's per-tensor
# loop (P) in eight fresh processes, F P F P F P F P, unprofiled: s23b's two pairs may not separate the change from
# the processes' own spread (s23c: four fused processes at 0.266, 0.361, 0.373, 0.368 s).
# Carry [".whl"]; one direct call:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   OUT=$OUT bash results/actor_update/s23d_device.sh
set -u
W=/tmp/s23d_work
mkdir -p "$W"
source results/actor_update/device_env.sh
lscpu | grep -E 'NUMA|^CPU\(s\)' >> "$O/env.txt"
for r in 0 1 2 3; do
  for mode in fused per_tensor; do
    python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 --min-response 1 --micro 16 --gas 4 \
      --workdir "$W/${mode}_$r" --cases rmpad_compiled --rounds 1 --steps 3 --budget 32768 --checkpointing off \
      --adam fused --overflow-check "$mode" --out "$O/t.tsv" > "$O/log_${mode}_$r.txt" 2>&1
    echo "$r $mode rc=$? $(grep -h '^# round' "$O/log_${mode}_$r.txt")"
  done
done | tee "$O/summary.txt"
for f in "$W"/*/run_*/rmpad_compiled_*.json; do echo "$(basename "$(dirname "$(dirname "$f")")") $(cat "$f")"; done > "$O/results.jsonl"
rm -f "$O"/log_*.txt "$O/t.tsv"
