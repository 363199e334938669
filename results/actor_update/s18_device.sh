#!/usr/bin/env bash
# Issue 35, session 18, both GPUs of a 2-H200 lease: where ZeRO-3's step goes. The worker benchmark at the issue's
# settings (0.6B shape, seq 1024, micro 2, GAS 4, checkpointing, FusedAdam), one round of FSDP2 (every micro-batch,
# as ZeRO reduces), ZeRO-3 and ZeRO-3 with a 5e7-element gradient bucket, each worker case with one more update
# profiled on rank 0 (--profile: phases.md with the communication, the GPU's idle time and the kernels). ZeRO-2
# left out (the s17b call before it measured ZeRO-2 on this session's first two-GPU machine) to fit the device time.
# Carry [".whl"]:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   GPUS=0,1 SCRIPT_TIMEOUT=560 bash scripts/seed_scale.sh bg z3 script results/actor_update/s18_device.sh
#   bash scripts/seed_scale.sh poll 560
set -u
source results/actor_update/device_env.sh
W=/tmp/s18_work
python3 -m repro.bench.workers --shape qwen3-0.6b --nproc 2 --rounds 1 --steps 5 \
  --cases zero3,zero3_bucket_5e7 --runners worker,fsdp2_each --workdir "$W" --profile "$O/profile" \
  --out "$O/workers.tsv" > "$O/workers.log" 2>&1
echo "workers rc=$?"; grep '^# round' "$O/workers.log"; cat "$O/workers.tsv" 2>/dev/null || tail -20 "$O/workers.log"
for f in "$W"/run_*/*_worker_r0.log; do echo "$(basename "$f"): $(grep -m2 '^# \(overlap_comm\|zero3 sizes\)' "$f" | tr '\n' ' ')"; done
for f in "$O"/profile/*/phases.md; do echo "== $f"; head -22 "$f"; done
# (the traces stay on the machine: poll brings back everything else)
