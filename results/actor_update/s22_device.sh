#!/usr/bin/env bash
# Issue 35, session 22, one H200: form C with the log-prob pass (--infer) in three more fresh processes, each pass
# profiled after its timed ones (--profile: phases.md per process), to say why the log-prob pass reaches 45%
# `perf/mfu/actor_infer` in some processes (48.5, 51.6%) and not others (33.7, 34.7%; sessions 17-18, s18b_device.sh).
# Carry [".whl"]; one direct call:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   OUT=$OUT bash results/actor_update/s22_device.sh
set -u
W=/tmp/s22_work
mkdir -p "$W"
source results/actor_update/device_env.sh
python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 --min-response 1 --micro 16 --gas 4 \
  --workdir "$W" --cases rmpad_compiled --rounds 3 --steps 3 --budget 32768 --checkpointing off --adam fused --infer \
  --profile "$O/prof" --out "$O/C_infer.tsv" > "$O/C_infer.log" 2>&1
echo "C_infer: rc=$?"; grep -h '^# round' "$O/C_infer.log"; cat "$O/C_infer.tsv" 2>/dev/null || tail -20 "$O/C_infer.log"
for f in "$W"/run_*/rmpad_compiled_*.json; do echo "$(basename "$f") $(cat "$f")"; done
find "$O/prof" -name '*.trace.json' -delete 2>/dev/null; find "$O/prof" -type f | head -20
