#!/usr/bin/env bash
# Issue 35, session 23, one H200: form C with the log-prob pass (--infer) in two fresh processes, each pass profiled
# after its timed ones (--profile), with the compiled layers no longer hooked (repro/workers/profiling.py) and their
# time labelled `compiled_layers` from dynamo's regions. TORCH_LOGS=recompiles says whether the profiled passes still
# compile anything (session 22: they did, `compile_attempt_1` 933 ms of the log-prob pass), and why.
# Carry [".whl"]; one direct call:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   OUT=$OUT bash results/actor_update/s23_device.sh
set -u
W=/tmp/s23_work
mkdir -p "$W"
source results/actor_update/device_env.sh
TORCH_LOGS=recompiles python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 --min-response 1 \
  --micro 16 --gas 4 --workdir "$W" --cases rmpad_compiled --rounds 2 --steps 3 --budget 32768 --checkpointing off \
  --adam fused --infer --profile "$O/prof" --out "$O/C_infer.tsv" > "$O/C_infer.log" 2>&1
echo "C_infer: rc=$?"; grep -h '^# round' "$O/C_infer.log"; cat "$O/C_infer.tsv" 2>/dev/null || tail -20 "$O/C_infer.log"
echo "recompile lines: $(grep -c -i 'recompil' "$O/C_infer.log")"; grep -i -A3 'recompil' "$O/C_infer.log" | head -40
for f in "$W"/run_*/rmpad_compiled_*.json; do echo "$(basename "$f") $(cat "$f")"; done
find "$O/prof" -name '*.trace.json' -delete 2>/dev/null
tar -C "$O" -czf "$O/prof.tgz" prof && rm -rf "$O/prof"; ls -la "$O"
