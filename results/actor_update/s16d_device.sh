#!/usr/bin/env bash
# Issue 35, session 16's last one-H100 call: form C of s16b_device.sh again, now through the config key
# (the bench's rmpad_compiled case sets actor_rollout_ref.model.compile_layers=inductor and the worker compiles the
# layers; the row reads back how many run compiled), on another machine: does 37% MFU hold?
# Carry [".whl"]; as s16_device.sh:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   GPUS=0 SCRIPT_TIMEOUT=400 BUDGET_S=400 bash scripts/seed_scale.sh bg s16d script results/actor_update/s16d_device.sh
#   bash scripts/seed_scale.sh poll 420
set -u
W=/tmp/s16_work
mkdir -p "$W"
source results/actor_update/device_env.sh
python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 --min-response 1 --micro 16 --gas 4 \
  --workdir "$W" --cases rmpad_compiled --rounds 2 --budget 32768 --checkpointing off --adam fused \
  --out "$O/key_C.tsv" > "$O/key_C.log" 2>&1
echo "key_C: rc=$?"; grep -h '^# round' "$O/key_C.log"; cat "$O/key_C.tsv" 2>/dev/null
for f in "$W"/run_*/rmpad_compiled_*.json; do python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].rsplit('/',1)[1], 'compiled_layers', d['compiled_layers'], 'checkpointing', d['checkpointing'], d['optimizer'], 'update_s', d['update_s'])" "$f"; done
