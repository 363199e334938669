#!/bin/bash
# Session 11's device plan on 4 GPUs, as it ran (2026-11-27): from the repository root as dev_s11.sh, started by
# the install call with `END=$(( $(date +%s) + 1580 )) setsid nohup bash dev_s11.sh &` (END: epoch seconds by
# which everything must have stopped); later calls polled /tmp/r11 and brought it back as a tarball.
# Its vfour run died when a later device call refreshed the working tree under it (results/4gpu/README.md,
# third lease): run such a plan with `bash scripts/seed_scale.sh bg ...` and `poll` instead.
cd "$(dirname "$0")"
export PYTHONPATH=/tmp/vsite:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 TRL_SITE=/tmp/trlsite PYTHONUNBUFFERED=1
R=/tmp/r11; mkdir -p $R
log(){ echo "$(date +%T) $*" >> $R/status.txt; }
waitfor(){ while [ ! -e "$R/$1.done" ]; do sleep 2; done; }
log start END=$END
( GPUS=0 OUT=$R/build bash scripts/seed_scale.sh build > $R/build.txt 2>&1; log build rc=$?; touch $R/build.done ) &
( CUDA_VISIBLE_DEVICES=1 PYTHONPATH=$PYTHONPATH timeout 420 python3 -m repro.bench.rmpad --shape qwen3-0.6b --cases rmpad \
    --rounds 1 --profile /tmp/prof --workdir /tmp/prof_work --out $R/prof_rmpad.tsv > $R/prof.txt 2>&1; log prof rc=$?
  mkdir -p $R/prof; for d in /tmp/prof/*/; do cp "$d"phases.md "$R/prof/$(basename "$d")_phases.md" 2>/dev/null; done
  touch $R/prof.done ) &
( OUT=$R/splen GPUS=2,3 bash -c 'bash scripts/seed_scale.sh splen 40960,65536 --no-gradient-checkpointing; SPLEN_TAG=ckpt bash scripts/seed_scale.sh splen 65536' > $R/splen.txt 2>&1; log splen rc=$?
  CUDA_VISIBLE_DEVICES=2,3 REPRO_GPU_TESTS=1 REPRO_REQUIRE_GPU=1 TORCH_CUDA_ARCH_LIST=9.0 NCCL_NVLS_ENABLE=0 timeout 300 \
    python3 -m pytest tests/gpu_e2e/test_ulysses_gpu.py tests/gpu_e2e/test_varlen_gpu.py -m gpu -v -s -p no:cacheprovider > $R/gputests.txt 2>&1; log gputests rc=$?
  waitfor build
  DEADLINE=$END REPRO_OUTPUTS_DIR=/tmp/routs/b GPUS=2,3 OUT=$R/z3 bash scripts/seed_scale.sh peers verl-deepspeed-zero3 20 > $R/z3.txt 2>&1; log z3 rc=$?
  touch $R/pair23.done ) &
( waitfor build; waitfor prof
  DEADLINE=$END REPRO_OUTPUTS_DIR=/tmp/routs/a GPUS=0,1 OUT=$R/vsp2 bash scripts/seed_scale.sh verl deepspeed 2 10 sp2 \
    actor_rollout_ref.actor.deepspeed.ulysses_sequence_parallel_size=2 > $R/vsp2.txt 2>&1; log vsp2 rc=$?
  touch $R/pair01.done ) &
waitfor pair01; waitfor pair23
left=$(( END - $(date +%s) ))
if [ $left -gt 300 ]; then
  DEADLINE=$END REPRO_OUTPUTS_DIR=/tmp/routs/c OUT=$R/vfour bash scripts/seed_scale.sh vfour 2 2 15 > $R/vfour.txt 2>&1; log vfour rc=$?
else log vfour skipped left=$left; fi
touch $R/all.done
