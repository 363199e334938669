#!/usr/bin/env bash
# Issue 35, for the next one-GPU lease (written in session 19, not run): enable_gradient_checkpointing=auto on the GPU.
# Form C (the issue's batch: 64 samples, 27.0k real tokens in one micro-batch, compiled layers and log-prob chunks,
# FusedAdam) with --checkpointing auto, one round each:
#  - budget 32,768 tokens a micro-batch: the activations should fit (session 17-18: 49 GB allocated without
#    checkpointing on an H200), so auto should choose off and time as `--checkpointing off` does (37-41%);
#  - budget 262,144 tokens: the same batch, but a micro-batch the plan allows 8x larger, which would not fit: auto
#    should choose on (the decision is the plan's worst case, not this batch's), and time as `--checkpointing on`.
# Each row's JSON carries `checkpointing` (read from the model's layers) and `checkpointing_auto` (bytes per token as
# measured on the GPU, tokens, gradient bytes, free memory). Carry [".whl"]; one direct call:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   OUT=$OUT bash results/actor_update/s20b_device.sh
set -u
W=/tmp/s20b_work
mkdir -p "$W"
source results/actor_update/device_env.sh
for budget in 32768 262144; do
  python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 --min-response 1 --micro 16 --gas 4 \
    --workdir "$W" --cases rmpad_compiled --rounds 1 --steps 3 --budget "$budget" --checkpointing auto --adam fused \
    --out "$O/C_auto_$budget.tsv" > "$O/C_auto_$budget.log" 2>&1
  echo "C_auto_$budget: rc=$?"; grep -h '^# round' "$O/C_auto_$budget.log"; cat "$O/C_auto_$budget.tsv" 2>/dev/null || tail -20 "$O/C_auto_$budget.log"
done
grep -rh "activation checkpointing auto" "$W"/run_*/*.log
for f in "$W"/run_*/rmpad_compiled_*.json; do echo "$(basename "$f") $(cat "$f")"; done
# The probe's count against the CUDA allocator (tests/gpu_e2e/test_activation_checkpointing_gpu.py: SDPA and varlen).
REPRO_GPU_TESTS=1 REPRO_REQUIRE_GPU=1 python3 -m pytest tests/gpu_e2e/test_activation_checkpointing_gpu.py -m gpu -v \
  -p no:cacheprovider > "$O/gpu_e2e_checkpointing.log" 2>&1
echo "gpu_e2e checkpointing rc=$?"; tail -15 "$O/gpu_e2e_checkpointing.log"
