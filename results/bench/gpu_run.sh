#!/usr/bin/env bash
# Device commands of results/bench/README.md (2x H200). $1: workers | six-case | crossover.
# DeepSpeed, Ray, Hydra, OmegaConf carried as wheels (no network there) and installed into /tmp/site;
# the tiny policy comes from the CPU-built cache carried as .cache_repro (REPRO_CACHE_DIR).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD TORCH_CUDA_ARCH_LIST=9.0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 REPRO_CACHE_DIR=$PWD/.cache_repro
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/device.txt"
date -u | tee -a "$OUT/device.txt"
case "$1" in
workers)
  timeout 400 python3 -m repro.bench.workers --shape qwen3-0.6b --nproc 2 \
    --cases zero1,zero2,zero3,zero3_noleaf,zero1_offload,zero2_offload,zero3_offload --runners worker,fsdp2 \
    --steps 3 --warmup 1 --timeout 150 --workdir /tmp/wb --out "$OUT/workers_table.tsv" 2>&1 | tee "$OUT/workers.log"
  timeout 150 python3 -m repro.bench.workers --shape qwen3-0.6b --nproc 2 --cases zero3,zero3_noleaf \
    --runners bare,fsdp2 --steps 3 --warmup 1 --timeout 70 --workdir /tmp/wb --out "$OUT/workers_bare.tsv" \
    2>&1 | tee "$OUT/workers_bare.log"
  tar czf "$OUT/workers_logs.tgz" -C /tmp/wb --exclude='model_*' . ; true ;;
six-case)
  SEED=7777 STEPS=60 RUN_TAG=gpu_six_case OUTPUTS_ROOT=/tmp/o PYTHON=python3 timeout 540 \
    bash scripts/bench/run_ds_zero_six_case_bench.sh -- -cn grpo_tiny trainer.device=cuda trainer.test_freq=0 \
    trainer.val_before_train=False trainer.save_freq=0 2>&1 | tee "$OUT/six_case.log"
  tar czf "$OUT/six_case.tgz" -C /tmp/o . ; cp /tmp/o/*/summary.tsv /tmp/o/*/curves.png "$OUT/" ;;
crossover)
  SEEDS="1 2" STEPS="${STEPS:-30}" RUN_TAG=gpu_crossover OUTPUTS_ROOT=/tmp/x PYTHON=python3 timeout 540 \
    bash scripts/bench/run_ds_zero12_seed_gate_bench.sh -- -cn grpo_tiny trainer.device=cuda trainer.test_freq=0 \
    trainer.val_before_train=False trainer.save_freq=0 2>&1 | tee "$OUT/crossover.log"
  tar czf "$OUT/crossover.tgz" -C /tmp/x . ; cp /tmp/x/*/*.tsv /tmp/x/*/curves.png "$OUT/" ;;
esac
