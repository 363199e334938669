#!/usr/bin/env bash
# Issue 35's one-H100 call of session 16: the actor update on the issue's own batch (64 samples, prompts up to 256,
# responses uniform up to 512: about 26.6k real tokens), without activation checkpointing, eager and compiled, at one
# and at two micro-batches, beside checkpointing on; then one profiled update of the fastest form.
# Why these: session 13's profile had the GPU idle 85% of a 4,096-token update (host-bound), and one 16,384-token
# micro-batch was 2.2x faster per token than three; a larger batch in fewer micro-batches amortises the host's
# per-micro-batch and per-step work, and without checkpointing the forward is not run twice (6N instead of 8N FLOPs
# a token). Every run prints its MFU by verl's formula and whether the engine's model ran checkpointed.
# Carry [".whl"]. As a background job with polls (one call each, back to back):
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   GPUS=0 SCRIPT_TIMEOUT=1100 BUDGET_S=1100 bash scripts/seed_scale.sh bg s16 script results/actor_update/s16_device.sh
#   bash scripts/seed_scale.sh poll 560
set -u
W=/tmp/s16_work
mkdir -p "$W"
source results/actor_update/device_env.sh
bench() {  # NAME ARGS...: one bench command on the batch, its table and its log kept
  local name=$1; shift
  python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 --min-response 1 --micro 16 --gas 4 \
    --workdir "$W" --host-ops --out "$O/$name.tsv" "$@" > "$W/$name.log" 2>&1
  echo "$name: rc=$?"; grep -h '^# round' "$W/$name.log" | grep -v 'host ops by' ; cat "$O/$name.tsv" 2>/dev/null
}
# checkpointing on (outer runs) around off (eager and compiled alternating, two rounds): one 32,768-token micro-batch
bench on_b32k_1 --cases rmpad --rounds 1 --budget 32768 --checkpointing on
bench off_b32k --cases rmpad,rmpad_compiled --rounds 2 --budget 32768 --checkpointing off
bench on_b32k_2 --cases rmpad --rounds 1 --budget 32768 --checkpointing on
# two micro-batches of 16,384 tokens without checkpointing: the memory that halves, the time it costs
bench off_b16k --cases rmpad,rmpad_compiled --rounds 1 --budget 16384 --checkpointing off
# the profile of the compiled, unchecked update at one micro-batch: where the rest of the time goes
bench profile --cases rmpad_compiled --rounds 1 --budget 32768 --checkpointing off --steps 2 --profile "$W/profile"
find "$W/profile" -name phases.md -exec cp {} "$O/phases.md" \;
tar -czf "$O/logs.tar.gz" -C "$W" --exclude='model_*' --exclude='*.trace.json' .
