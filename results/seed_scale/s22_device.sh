#!/usr/bin/env bash
# Issue 35, session 22 (two GPUs): the GRPO step at the seed's scale (`-cn grpo_0p6b`, vLLM 0.25.1) with ZeRO-2, with
# ZeRO-3 as the worker bench found it fastest (torch's linear, the layers' weights whole at persistence 1e7, repro's
# coalesced gather and DeepSpeed's hooks off the whole modules: the engine's defaults) and the same ZeRO-3 with
# DeepSpeed's hooks on every module. Each run 12 steps, seed 1, validation off (`seed_scale.sh sp`), one after the
# other on both GPUs; the update and log-prob pass times are the runs' own `timing_s/*` metrics.
# The payload arrives over 12 back-to-back device calls (the machine keeps /tmp 30 s after a call):
#   bash results/seed_scale/s22_device.sh carry DIR     # carry [DIR]: .whl (starts the policy build), .whl2, .whl3,
#                                                       # .vc1 ... .vc8
#   bash results/seed_scale/s22_device.sh start         # carry [".vc9"]: installs vLLM and Ray, starts the jobs
#   bash scripts/seed_scale.sh poll 540                 # then again in the next call; results in plan.tar.gz
set -u
case "${1:?carry DIR | start}" in
  carry)
    d=${2:?folder}; case "$d" in
      .whl) python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl &&  # the policy
              PYTHONPATH=/tmp/site:$PWD GPUS=0,1 bash scripts/seed_scale.sh bg build build ;;  # builds meanwhile
      .vc*) mkdir -p "/tmp/vchunks/c${d#.vc}" && cp "$d"/* "/tmp/vchunks/c${d#.vc}/" ;;
      *) mkdir -p /tmp/chunks && cp "$d"/* /tmp/chunks/ ;;
    esac; echo "carried $d: $(du -sh /tmp/chunks /tmp/vchunks /tmp/site 2>/dev/null | tr '\n' ' ')" ;;
  start)
    mkdir -p /tmp/vchunks/c9 && cp .vc9/* /tmp/vchunks/c9/ && bash /tmp/vchunks/c9/install.sh > /tmp/vinstall.log 2>&1 \
      || { tail -5 /tmp/vinstall.log; exit 1; }
    cat /tmp/chunks/ray.part.* > /tmp/chunks/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl && python3 -m pip install -q \
      --no-index --no-deps --no-compile --target /tmp/site /tmp/chunks/ray-*.whl || exit 1
    export PYTHONPATH=/tmp/vsite:/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0
    Z3=(actor_rollout_ref.actor.deepspeed.stage3_param_persistence_threshold=10000000
        actor_rollout_ref.actor.deepspeed.memory_efficient_linear=false)
    S=scripts/seed_scale.sh; export GPUS=0,1 RUN_TIMEOUT=420
    RUN_NAME=g22_zero2 bash $S bg z2 after=build sp 2 1 12
    RUN_NAME=g22_zero3 bash $S bg z3 after=z2 sp 3 1 12 "${Z3[@]}"
    RUN_NAME=g22_zero3_hooked bash $S bg z3h after=z3 sp 3 1 12 "${Z3[@]}" \
      actor_rollout_ref.actor.deepspeed.zero3_unhook_persistent_modules=false ;;
esac
