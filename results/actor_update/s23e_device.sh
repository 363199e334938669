#!/usr/bin/env bash
# Issue 35, session 23, one H200: s23d_device.sh's alternation carried on where its call ran out (its eighth process,
# per_tensor), then one more fused: P F, each a fresh process, unprofiled.
# Carry [".whl"]; one direct call:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   OUT=$OUT bash results/actor_update/s23e_device.sh
set -u
W=/tmp/s23e_work
mkdir -p "$W"
source results/actor_update/device_env.sh
for mode in per_tensor fused; do
  python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 --min-response 1 --micro 16 --gas 4 \
    --workdir "$W/$mode" --cases rmpad_compiled --rounds 1 --steps 3 --budget 32768 --checkpointing off \
    --adam fused --overflow-check "$mode" --out "$O/t.tsv" > "$O/log_$mode.txt" 2>&1
  echo "$mode rc=$? $(grep -h '^# round' "$O/log_$mode.txt")"
done | tee "$O/summary.txt"
for f in "$W"/*/run_*/rmpad_compiled_*.json; do echo "$(basename "$(dirname "$(dirname "$f")")") $(cat "$f")"; done > "$O/results.jsonl"
rm -f "$O"/log_*.txt "$O/t.tsv"
