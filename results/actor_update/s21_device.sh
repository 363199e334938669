#!/usr/bin/env bash
# Issue 35, session 21 (two GPUs): ZeRO-3 with the layers' weights whole (zero3_persist_1e7), now also without
# DeepSpeed's fetch/release hooks on the modules whose weights all stay whole (repro.workers.zero3_persist_hooks, the
# engine's default since this session), against the same case with DeepSpeed's hooks on every module
# (zero3_persist_1e7_hooked) and FSDP2 reducing after every micro-batch: three rounds at micro 2 x GAS 4; then one
# round at one micro-batch of 8 x 1,024 tokens with ZeRO-2 beside them. Each case's log reads back `gather=` and
# `hooked_modules=` from the engine. Carry [".whl"]; about 9 minutes, so run it as a background job and poll twice:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   GPUS=0,1 SCRIPT_TIMEOUT=800 bash scripts/seed_scale.sh bg z3h script results/actor_update/s21_device.sh
#   bash scripts/seed_scale.sh poll 540; bash scripts/seed_scale.sh poll 300   # the second in the next call
set -u
source results/actor_update/device_env.sh
W=/tmp/s21_work
python3 -m repro.bench.workers --shape qwen3-0.6b --nproc 2 --rounds 3 --steps 5 \
  --cases zero3_persist_1e7,zero3_persist_1e7_hooked --runners worker,fsdp2_each --workdir "$W" \
  --out "$O/workers.tsv" > "$O/workers.log" 2>&1
echo "workers rc=$?"; grep '^# round' "$O/workers.log"; cat "$O/workers.tsv" 2>/dev/null || tail -20 "$O/workers.log"
python3 -m repro.bench.workers --shape qwen3-0.6b --nproc 2 --rounds 1 --steps 5 --micro 8 --gas 1 \
  --cases zero2,zero3_persist_1e7,zero3_persist_1e7_hooked --runners worker,fsdp2_each --workdir "$W/micro8" \
  --out "$O/workers_micro8.tsv" > "$O/workers_micro8.log" 2>&1
echo "workers micro 8 rc=$?"; grep '^# round' "$O/workers_micro8.log"; cat "$O/workers_micro8.tsv" 2>/dev/null || tail -20 "$O/workers_micro8.log"
for f in "$W"/run_*/*_worker_r0.log "$W"/micro8/run_*/*_worker_r0.log; do
  echo "$(basename "$f"): $(grep -m2 '^# \(overlap_comm\|zero3 sizes\)' "$f" | tr '\n' ' ')"; done
