#!/usr/bin/env bash
# Device command of results/bench/zero3_defaults.md: DeepSpeed's constant ZeRO-3 sizes against the
# size-aware ones (repro.zero3_defaults), alternated in one command, beside FSDP2, at the Qwen3-0.6B
# shape. $1: number of GPUs (ranks). Wheels (.whl, no Ray needed) installed into /tmp/site first.
set -uo pipefail
NPROC="${1:-2}"
export PYTHONPATH=/tmp/site:$PWD TORCH_CUDA_ARCH_LIST=9.0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/device.txt"
date -u | tee -a "$OUT/device.txt"
common=(--shape qwen3-0.6b --nproc "$NPROC" --steps 3 --warmup 1 --timeout 90 --workdir /tmp/z3b)
# No offload: old and new sizes alternated over 2 rounds, FSDP2 once per round.
timeout 190 python3 -m repro.bench.workers "${common[@]}" --cases zero3_dsdefaults,zero3 --runners worker,fsdp2 \
  --rounds 2 --out "$OUT/zero3.tsv" 2>&1 | tee "$OUT/zero3.log"
# CPU optimizer + parameter offload: old then new, one round (CPUAdam is JIT-built by the first).
timeout 110 python3 -m repro.bench.workers "${common[@]}" --cases zero3_offload_dsdefaults,zero3_offload \
  --runners worker --rounds 1 --out "$OUT/zero3_offload.tsv" 2>&1 | tee "$OUT/zero3_offload.log"
# What each engine took, from DeepSpeed's own log lines.
grep -H "^# zero3 sizes" /tmp/z3b/*.log | sort | uniq > "$OUT/sizes.txt"
tar czf "$OUT/logs.tgz" -C /tmp/z3b --exclude='model_*' . ; true
