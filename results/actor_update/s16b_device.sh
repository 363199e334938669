#!/usr/bin/env bash
# Issue 35, session 16's second one-H100 call: the two largest costs left in session 16's first profile of the
# compiled, unchecked update (results/actor_update/README.md): the eager log-prob chunks (82 ms of GPU time, more
# than the LM head) and torch's AdamW (38 ms of kernels, 71 ms of host work). First the compiled log-probs' GPU
# test; then on the batch (as s16_device.sh: 64 samples, about 26.6k real tokens, one 32,768-token
# micro-batch, compiled decoder layers, no checkpointing), A B C C B A over three forms:
#   A  log-probs eager,    torch AdamW        (session 16's best: 0.41 s, 31% MFU)
#   B  log-probs compiled, torch AdamW
#   C  log-probs compiled, DeepSpeed FusedAdam (repro's CUDA default; JIT-built in C's first run)
# then one profiled update of C. Carry [".whl"]; as s16_device.sh:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   GPUS=0 SCRIPT_TIMEOUT=1100 BUDGET_S=1100 bash scripts/seed_scale.sh bg s16b script results/actor_update/s16b_device.sh
#   bash scripts/seed_scale.sh poll 560
set -u
W=/tmp/s16_work
mkdir -p "$W"
source results/actor_update/device_env.sh
REPRO_GPU_TESTS=1 python3 -m pytest tests/gpu_e2e/test_logprob_gpu.py -q -p no:cacheprovider > "$O/gpu_test.log" 2>&1
echo "gpu test rc=$?"; tail -3 "$O/gpu_test.log"
bench() {  # NAME ARGS...: one bench command on the batch, its table and its log kept
  local name=$1; shift
  python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 --min-response 1 --micro 16 --gas 4 \
    --workdir "$W" --host-ops --cases rmpad_compiled --rounds 1 --budget 32768 --checkpointing off \
    --out "$O/$name.tsv" "$@" > "$W/$name.log" 2>&1
  echo "$name: rc=$?"; grep -h '^# round' "$W/$name.log" | grep -v 'host ops by'; tail -1 "$O/$name.tsv" 2>/dev/null
}
n=0
for form in A B C C B A; do
  n=$((n + 1))
  case $form in
    A) bench "${n}_A" --logprob eager --adam torch ;;
    B) bench "${n}_B" --logprob compiled --adam torch ;;
    C) bench "${n}_C" --logprob compiled --adam fused ;;
  esac
done
bench profile_C --logprob compiled --adam fused --steps 2 --profile "$W/profile"
find "$W/profile" -name phases.md -exec cp {} "$O/phases.md" \;
tar -czf "$O/logs.tar.gz" -C "$W" --exclude='model_*' --exclude='*.trace.json' --exclude='profile' .
