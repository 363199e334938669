#!/usr/bin/env bash
# Issue 35, session 17, one H200 (2-GPU kinds were not lent at the time), before the policy build: form C of
# s16d_device.sh (the batch, one 32,768-token micro-batch, compiled decoder layers through the config key,
# compiled log-prob chunks, no checkpointing, DeepSpeed FusedAdam) for three rounds, now with --infer: the
# old-log-prob pass timed on the same batch and its perf/mfu/actor_infer (goal 45%) beside the update's (goal 35%).
#   GPUS=0 SCRIPT_TIMEOUT=420 bash scripts/seed_scale.sh bg rmp script results/actor_update/s17_device.sh
set -u
W=/tmp/s17_work
mkdir -p "$W"
source results/actor_update/device_env.sh
python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 --min-response 1 --micro 16 --gas 4 \
  --workdir "$W" --cases rmpad_compiled --rounds 3 --budget 32768 --checkpointing off --adam fused --infer \
  --out "$O/C_infer.tsv" > "$O/C_infer.log" 2>&1
echo "C_infer: rc=$?"; grep -h '^# round' "$O/C_infer.log"; cat "$O/C_infer.tsv" 2>/dev/null || tail -20 "$O/C_infer.log"
for f in "$W"/run_*/rmpad_compiled_*.json; do python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].rsplit('/',1)[1], {k: d.get(k) for k in ('compiled_layers', 'checkpointing', 'optimizer', 'update_s', 'mfu', 'infer_s', 'infer_each_s', 'infer_mfu')})" "$f"; done
