#!/usr/bin/env bash
# Issue 35, for the next two-GPU lease (not run in session 18: its device time was spent): ZeRO-3's host work per
# layer. s18_device.sh's profile put the GPU idle 88% of a ZeRO-3 update at the worker benchmark's settings, 155 ms
# of that in DeepSpeed's LinearFunctionForZeroStage3 (the process-wide replacement of torch.nn.functional.linear,
# zero_optimization.memory_efficient_linear). Here ZeRO-3 as it is, with the 5e7 gradient bucket, and with torch's
# linear (actor.deepspeed.memory_efficient_linear=false, read back in each case's log), against FSDP2 reducing after
# every micro-batch, two rounds, each worker case profiled once more on rank 0. Then the same stages at a batch the
# GPU's time sets (one micro-batch of 8 x 1,024 tokens a step instead of four of 2 x 1,024: the host's work per
# token a quarter), one round. Carry [".whl"]; the script outlives one call (two polls):
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   GPUS=0,1 SCRIPT_TIMEOUT=900 bash scripts/seed_scale.sh bg z3l script results/actor_update/s18c_device.sh
#   bash scripts/seed_scale.sh poll 560; bash scripts/seed_scale.sh poll 560   # the second in the next call
set -u
source results/actor_update/device_env.sh
W=/tmp/s18c_work
python3 -m repro.bench.workers --shape qwen3-0.6b --nproc 2 --rounds 2 --steps 5 \
  --cases zero3,zero3_bucket_5e7,zero3_torch_linear --runners worker,fsdp2_each --workdir "$W" --profile "$O/profile" \
  --out "$O/workers.tsv" > "$O/workers.log" 2>&1
echo "workers rc=$?"; grep '^# round' "$O/workers.log"; cat "$O/workers.tsv" 2>/dev/null || tail -20 "$O/workers.log"
for f in "$W"/run_*/*_worker_r0.log; do echo "$(basename "$f"): $(grep -m2 '^# \(overlap_comm\|zero3 sizes\)' "$f" | tr '\n' ' ')"; done
for f in "$O"/profile/*/phases.md; do echo "== $f"; head -40 "$f"; done
python3 -m repro.bench.workers --shape qwen3-0.6b --nproc 2 --rounds 1 --steps 5 --micro 8 --gas 1 \
  --cases zero2,zero3,zero3_torch_linear --runners worker,fsdp2_each --workdir "$W" \
  --out "$O/workers_micro8.tsv" > "$O/workers_micro8.log" 2>&1
echo "workers micro 8 rc=$?"; grep '^# round' "$O/workers_micro8.log"; cat "$O/workers_micro8.tsv" 2>/dev/null || tail -20 "$O/workers_micro8.log"
