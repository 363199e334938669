#!/usr/bin/env bash
# Issue 35, session 18, one H200: form C with the log-prob pass (--infer) in three fresh processes after the K/V change
# of session 17 (repro/workers/varlen.py passes GQA's K and V unrepeated), which s17d_device.sh measured in one
# process only (update 38.0%, log-prob pass 51.6%). Carry [".whl"]; one direct call:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   OUT=$OUT bash results/actor_update/s18b_device.sh
set -u
W=/tmp/s18b_work
mkdir -p "$W"
source results/actor_update/device_env.sh
python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 --min-response 1 --micro 16 --gas 4 \
  --workdir "$W" --cases rmpad_compiled --rounds 3 --steps 3 --budget 32768 --checkpointing off --adam fused --infer \
  --out "$O/C_gqa3.tsv" > "$O/C_gqa3.log" 2>&1
echo "C_gqa3: rc=$?"; grep -h '^# round' "$O/C_gqa3.log"; cat "$O/C_gqa3.tsv" 2>/dev/null || tail -20 "$O/C_gqa3.log"
for f in "$W"/run_*/rmpad_compiled_*.json; do echo "$(basename "$f") $(cat "$f")"; done
