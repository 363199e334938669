#!/usr/bin/env bash
# Issue 35, session 17's last one-H200 call: K and V go to FlashAttention with their own 8 heads (repro/workers/varlen.py)
# instead of repeated to the query's 16 (the 27 ms copy kernel of s17c_device.sh's kernel table). First the varlen GPU
# tests (GQA shapes: packed log-probs and gradients against the padded batch, the kernel against block-causal SDPA),
# then form C with --infer once more.
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   GPUS=0 SCRIPT_TIMEOUT=300 bash scripts/seed_scale.sh bg gqa script results/actor_update/s17d_device.sh
set -u
W=/tmp/s17d_work
mkdir -p "$W"
source results/actor_update/device_env.sh
REPRO_GPU_TESTS=1 python3 -m pytest tests/gpu_e2e/test_varlen_gpu.py -q -s -p no:cacheprovider > "$O/varlen_test.log" 2>&1
echo "varlen gpu test rc=$?"; grep -E "max \||varlen vs|attending|passed|failed|Error" "$O/varlen_test.log" | head -12
python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 --min-response 1 --micro 16 --gas 4 \
  --workdir "$W" --cases rmpad_compiled --rounds 1 --steps 3 --budget 32768 --checkpointing off --adam fused --infer \
  --out "$O/C_gqa.tsv" > "$O/C_gqa.log" 2>&1
echo "C_gqa: rc=$?"; grep -h '^# round' "$O/C_gqa.log"; cat "$O/C_gqa.tsv" 2>/dev/null || tail -20 "$O/C_gqa.log"
