#!/usr/bin/env bash
# Issue 35, for the next two-GPU lease (written in session 19, not run): ZeRO-3 with the layers' weights whole
# (zero3_persist_1e7) reached 0.956x FSDP2 on two H200s at micro 2 x GAS 4, its two rounds 1.10 and 1.25 s against
# FSDP2's 1.10 and 1.15 s: three rounds each here, to say whether it is at FSDP2's speed or below it. Then at one
# micro-batch of 8 x 1,024 tokens, where it stayed at 0.71x (a per-step cost, not a per-micro-batch one), each worker
# case profiled once more on rank 0 (phases.md: which host ops the GPU waits on in that step). The engine's own
# readings go into each case's log (`persistence=... persistent_params=...`: 309 of the 0.6B shape's parameters at
# 1e7, the norms' 113 at the size-aware 1e5). Carry [".whl"]; about 8 minutes, so one poll after the start may not do:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   GPUS=0,1 SCRIPT_TIMEOUT=700 bash scripts/seed_scale.sh bg z3m script results/actor_update/s20_device.sh
#   bash scripts/seed_scale.sh poll 540; bash scripts/seed_scale.sh poll 300   # the second in the next call
set -u
source results/actor_update/device_env.sh
W=/tmp/s20_work
python3 -m repro.bench.workers --shape qwen3-0.6b --nproc 2 --rounds 3 --steps 5 \
  --cases zero3_persist_1e7 --runners worker,fsdp2_each --workdir "$W" \
  --out "$O/workers.tsv" > "$O/workers.log" 2>&1
echo "workers rc=$?"; grep '^# round' "$O/workers.log"; cat "$O/workers.tsv" 2>/dev/null || tail -20 "$O/workers.log"
python3 -m repro.bench.workers --shape qwen3-0.6b --nproc 2 --rounds 1 --steps 5 --micro 8 --gas 1 \
  --cases zero2,zero3_persist_1e7 --runners worker,fsdp2_each --workdir "$W" --profile "$O/profile_micro8" \
  --out "$O/workers_micro8.tsv" > "$O/workers_micro8.log" 2>&1
echo "workers micro 8 rc=$?"; grep '^# round' "$O/workers_micro8.log"; cat "$O/workers_micro8.tsv" 2>/dev/null || tail -20 "$O/workers_micro8.log"
for f in "$W"/run_*/*_worker_r0.log; do echo "$(basename "$f"): $(grep -m2 '^# \(overlap_comm\|zero3 sizes\)' "$f" | tr '\n' ' ')"; done
for f in "$O"/profile_micro8/*/phases.md; do echo "== $f"; head -45 "$f"; done
