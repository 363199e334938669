#!/usr/bin/env bash
# Issue 35, session 16's 2-GPU call: the worker benchmark at the issue's settings (0.6B shape, seq 1024, micro 2,
# GAS 4, checkpointing; DeepSpeed's FusedAdam, as repro's CUDA default) after this session's compiled log-probs
# (repro.workers.logprob MODE auto: compiled on CUDA), ZeRO-1/2/3 beside FSDP2, two rounds alternating.
# Carry [".whl"] on an nvidia-h100-x2; as s16_device.sh:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   GPUS=0,1 SCRIPT_TIMEOUT=1000 BUDGET_S=1000 bash scripts/seed_scale.sh bg s16c script results/actor_update/s16c_device.sh
#   bash scripts/seed_scale.sh poll 560
set -u
source results/actor_update/device_env.sh
python3 -m repro.bench.workers --shape qwen3-0.6b --nproc 2 --rounds 2 --cases zero1,zero2,zero3 \
  --runners worker,fsdp2 --workdir /tmp/s16c_work --out "$O/workers.tsv" > "$O/workers.log" 2>&1
echo "workers rc=$?"; cat "$O/workers.tsv" 2>/dev/null || tail -20 "$O/workers.log"
