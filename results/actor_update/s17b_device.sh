#!/usr/bin/env bash
# Issue 35, session 17, both GPUs of the 2-H200 lease: the worker benchmark at the issue's settings (0.6B shape,
# seq 1024, micro 2, GAS 4, checkpointing, FusedAdam) with ZeRO-2's overlap_comm (the new key
# actor.deepspeed.overlap_comm: the reduce on DeepSpeed's side stream during the backward) in buckets of 5e7 and
# 2e8 elements, beside ZeRO-1, plain ZeRO-2 (5e8, no overlap) and FSDP2 reducing once a step (fsdp2) and after every
# micro-batch (fsdp2_each, verl's default, as ZeRO-2 reduces); two rounds alternating, 8 measured steps.
# Each case's log says what DeepSpeed took ("# overlap_comm=... reduce_bucket_size=..."). Not yet run: no two-GPU
# machine was lent while session 17 had device time. Carry [".whl"] on an nvidia-h200-x2 (or h100-x2):
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   GPUS=0,1 SCRIPT_TIMEOUT=560 bash scripts/seed_scale.sh bg wb script results/actor_update/s17b_device.sh
#   bash scripts/seed_scale.sh poll 560
set -u
source results/actor_update/device_env.sh
W=/tmp/s17b_work
python3 -m repro.bench.workers --shape qwen3-0.6b --nproc 2 --rounds 2 --steps 8 \
  --cases zero1,zero2,zero2_overlap,zero2_overlap_2e8 --runners worker,fsdp2,fsdp2_each --workdir "$W" \
  --out "$O/workers.tsv" > "$O/workers.log" 2>&1
echo "workers rc=$?"; grep '^# round' "$O/workers.log"; cat "$O/workers.tsv" 2>/dev/null || tail -20 "$O/workers.log"
grep -h '^# overlap_comm' "$W"/run_*/*_worker_r0.log 2>/dev/null
for f in "$W"/run_*/*_worker_r0.log; do echo "$(basename "$f"): $(grep -m1 '^# overlap_comm' "$f")"; done
