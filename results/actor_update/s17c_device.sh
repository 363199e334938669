#!/usr/bin/env bash
# Issue 35, session 17's second one-H200 call: where the log-prob pass's time goes (39% perf/mfu/actor_infer in
# s17_device.sh against the 45% asked). Form C of s17_device.sh once more with --profile: one more update and one
# more log-prob pass under torch.profiler after the timed ones, each split into phases beside its ideal at peak
# (the log-prob pass's ideal a third of the update's FLOPs, as verl's formula counts it). Run twice: the second time
# (after repro/bench/profile_kernels.py) each phases.md also sums the kernels by kind (GEMM, attention, inductor's
# triton, ...): the compiled layers open no repro:: range, so the phase table alone cannot split them.
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   GPUS=0 SCRIPT_TIMEOUT=400 bash scripts/seed_scale.sh bg prof script results/actor_update/s17c_device.sh
set -u
W=/tmp/s17c_work
mkdir -p "$W"
source results/actor_update/device_env.sh
python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 --min-response 1 --micro 16 --gas 4 \
  --workdir "$W" --cases rmpad_compiled --rounds 1 --steps 3 --budget 32768 --checkpointing off --adam fused --infer \
  --profile "$W/profile" --out "$O/C_profile.tsv" > "$O/C_profile.log" 2>&1
echo "C_profile: rc=$?"; grep -h '^# round' "$O/C_profile.log"; cat "$O/C_profile.tsv" 2>/dev/null || tail -20 "$O/C_profile.log"
for d in "$W"/profile/*/; do cp "$d/phases.md" "$O/phases_$(basename "$d").md" && cat "$O/phases_$(basename "$d").md"; done
