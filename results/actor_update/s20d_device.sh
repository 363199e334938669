#!/usr/bin/env bash
# Issue 35, session 20's last device seconds (two GPUs): ZeRO-3 with the layers' weights whole, its post-step gather of
# them coalesced into one all-gather (zero3_persist_1e7, repro's default since this session) against DeepSpeed's own
# gather, one all-gather per parameter (zero3_persist_1e7_stock), and FSDP2 reducing after every micro-batch; one
# round at micro 2 x GAS 4, each case's log line reading back `gather=`. Carry [".whl"]; one direct call:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   OUT=$OUT bash results/actor_update/s20d_device.sh
set -u
source results/actor_update/device_env.sh
W=/tmp/s20d_work
python3 -m repro.bench.workers --shape qwen3-0.6b --nproc 2 --rounds 1 --steps 5 \
  --cases zero3_persist_1e7,zero3_persist_1e7_stock --runners worker,fsdp2_each --workdir "$W" \
  --out "$O/workers.tsv" > "$O/workers.log" 2>&1
echo "workers rc=$?"; grep '^# round' "$O/workers.log"; cat "$O/workers.tsv" 2>/dev/null || tail -20 "$O/workers.log"
for f in "$W"/run_*/*_worker_r0.log; do echo "$(basename "$f"): $(grep -m1 '^# zero3 sizes' "$f")"; done
