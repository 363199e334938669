#!/usr/bin/env bash
# Issue 35, session 19 (two H200s): s18c_device.sh put ZeRO-3 with torch's linear at 0.79x FSDP2 (micro 2 x GAS 4)
# and 0.70x at one micro-batch of 8, the GPU idle ~88% of the step while the host runs the hooks. Here the next knob
# the issue names: ZeRO-3 with every parameter below 1e7 elements whole on each rank (zero3_persist_1e7: all of the
# layers' weights, the embedding sharded; the persistence read back in each case's log), beside ZeRO-3 with torch's
# linear, ZeRO-2 and FSDP2 reducing after every micro-batch, two rounds; then the same at micro 8 x GAS 1, one round.
# Carry [".whl"]:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   GPUS=0,1 SCRIPT_TIMEOUT=700 bash scripts/seed_scale.sh bg z3p script results/actor_update/s19_device.sh
set -u
source results/actor_update/device_env.sh
W=/tmp/s19_work
python3 -m repro.bench.workers --shape qwen3-0.6b --nproc 2 --rounds 2 --steps 5 \
  --cases zero2,zero3_torch_linear,zero3_persist_1e7 --runners worker,fsdp2_each --workdir "$W" \
  --out "$O/workers.tsv" > "$O/workers.log" 2>&1
echo "workers rc=$?"; grep '^# round' "$O/workers.log"; cat "$O/workers.tsv" 2>/dev/null || tail -20 "$O/workers.log"
for f in "$W"/run_*/*_worker_r0.log; do echo "$(basename "$f"): $(grep -m2 '^# \(overlap_comm\|zero3 sizes\)' "$f" | tr '\n' ' ')"; done
python3 -m repro.bench.workers --shape qwen3-0.6b --nproc 2 --rounds 1 --steps 5 --micro 8 --gas 1 \
  --cases zero3_persist_1e7 --runners worker,fsdp2_each --workdir "$W" \
  --out "$O/workers_micro8.tsv" > "$O/workers_micro8.log" 2>&1
echo "workers micro 8 rc=$?"; grep '^# round' "$O/workers_micro8.log"; cat "$O/workers_micro8.tsv" 2>/dev/null || tail -20 "$O/workers_micro8.log"
