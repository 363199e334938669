#!/usr/bin/env bash
# Issue 35, session 23, one H200: (1) the fused inf/NaN test against DeepSpeed's on CUDA
# (tests/gpu_e2e/test_overflow_check_gpu.py); (2) form C's update with repro's fused test (default) and with
# DeepSpeed's per-tensor loop (--overflow-check per_tensor), alternated in four fresh processes (F P F P), each
# profiled after its timed updates.
# Carry [".whl"]; one direct call:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   OUT=$OUT bash results/actor_update/s23b_device.sh
set -u
W=/tmp/s23b_work
mkdir -p "$W"
source results/actor_update/device_env.sh
REPRO_GPU_TESTS=1 python3 -m pytest tests/gpu_e2e/test_overflow_check_gpu.py -q -p no:cacheprovider > "$O/gpu_test.log" 2>&1
echo "gpu test: rc=$?"; tail -2 "$O/gpu_test.log"
for r in 0 1; do
  for mode in fused per_tensor; do
    python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 --min-response 1 --micro 16 --gas 4 \
      --workdir "$W" --cases rmpad_compiled --rounds 1 --steps 3 --budget 32768 --checkpointing off --adam fused \
      --overflow-check "$mode" --profile "$O/prof/${mode}_$r" --out "$O/C_${mode}_$r.tsv" > "$O/C_${mode}_$r.log" 2>&1
    echo "$mode $r: rc=$?"; grep -h '^# round' "$O/C_${mode}_$r.log"
  done
done
for f in "$W"/run_*/rmpad_compiled_*.json; do echo "$(basename "$(dirname "$f")")/$(basename "$f") $(cat "$f")"; done
find "$O/prof" -name '*.trace.json' -delete 2>/dev/null
cat "$O"/C_*.tsv > "$O/C_all.tsv"
tar -C "$O" -czf "$O/runs.tgz" prof C_fused_0.log C_fused_1.log C_per_tensor_0.log C_per_tensor_1.log && rm -rf "$O/prof" "$O"/C_*_?.log "$O"/C_*_?.tsv
ls -la "$O"
