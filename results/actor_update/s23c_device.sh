#!/usr/bin/env bash
# Issue 35, session 23, one H200: form C with the fused overflow test (the default) and the log-prob pass (--infer)
# in four more fresh processes, unprofiled: the update's and the log-prob pass's MFU across processes.
# Carry [".whl"]; one direct call:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   OUT=$OUT bash results/actor_update/s23c_device.sh
set -u
W=/tmp/s23c_work
mkdir -p "$W"
source results/actor_update/device_env.sh
python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 --min-response 1 --micro 16 --gas 4 \
  --workdir "$W" --cases rmpad_compiled --rounds 4 --steps 3 --budget 32768 --checkpointing off --adam fused --infer \
  --out "$O/C_infer.tsv" > "$O/C_infer.log" 2>&1
echo "C_infer: rc=$?"; grep -h '^# round' "$O/C_infer.log"; cat "$O/C_infer.tsv" 2>/dev/null || tail -20 "$O/C_infer.log"
for f in "$W"/run_*/rmpad_compiled_*.json; do echo "$(basename "$f") $(cat "$f")"; done > "$O/results.jsonl"
cat "$O/results.jsonl"
