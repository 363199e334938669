#!/usr/bin/env bash
# Issue 35, session 25, one H200: FlashAttention-4 behind torch's flash ops (model.flash_attention=fa4,
# repro/workers/varlen.py) against torch's bundled FlashAttention-2 on form C. Session 24's split of the compiled
# layers (results/actor_update/README.md) put the attention kernels at ~11% of their ideal, the kind farthest below
# peak. First the GPU parity test of the FA4 path (tests/gpu_e2e/test_varlen_gpu.py), then form C with --infer in
# fresh processes, fa4 torch fa4 (FA4 first: if it fails, the call says so early). One result line per
# process is appended as it ends, so a cut call keeps what ran. Session 25 then refused fa4 with torch 2.11 (what
# these calls measured); session 26 replaced torch's FA4 glue with repro's (repro/workers/fa4_kernels.py), so this
# script now runs that glue: results/actor_update/s26_device.sh is its successor.
# Wheels (the machine has no network; one call carries 64 MiB, so two calls within the 30 s the machine stays warm):
#   call 1, carry [".whl4", ".whl"]: mkdir -p /tmp/chunks && cp .whl4/* /tmp/chunks/ &&
#     python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   call 2, carry [".whl5"]: OUT=$OUT bash results/actor_update/s25_device.sh
# .whl4/.whl5 come from `bash scripts/fa4_wheels.sh` (flash-attn-4 4.0.0b36, nvidia-cutlass-dsl 4.8.1 with its CUDA 13
# libraries split in two, and the rest of its requirements). The tree travels with each call: with results/, fixtures/
# and repro/data/tiny_policy_weights/ (about 20 MB together) .whl5 does not fit, so session 25 moved them aside,
# all but this script and device_env.sh, while it ran the calls (the test and the bench read none of them), and back.
set -u
W=/tmp/s25_work
mkdir -p "$W"
bash scripts/fa4_install.sh  # inline in session 25's calls; the same steps since moved there
source results/actor_update/device_env.sh
export PYTHONPATH=$PYTHONPATH:/tmp/site/nvidia_cutlass_dsl/dsl_packages
python3 - >> "$O/env.txt" 2>&1 <<'PY'
import importlib.metadata as md, torch, torch.nn.attention as a
print("flash attention registry:", getattr(a, "list_flash_attention_impls", lambda: "none")())
for d in ("flash-attn-4", "nvidia-cutlass-dsl", "cuda-bindings", "einops", "protobuf"):
    try: print(d, md.version(d))
    except md.PackageNotFoundError: print(d, "missing")
import flash_attn.cute.interface
print("flash_attn.cute.interface imported")
import torch.nn.attention.varlen
print("torch_attn::_varlen_attn", torch.ops.torch_attn._varlen_attn.default._schema)
PY
REPRO_GPU_TESTS=1 timeout 240 python3 -m pytest -q -s -p no:cacheprovider tests/gpu_e2e/test_varlen_gpu.py \
  > "$O/gpu_test.txt" 2>&1
echo "gpu test rc=$?" | tee -a "$O/summary.txt"
tail -3 "$O/gpu_test.txt" >> "$O/summary.txt"
i=0
for impl in fa4 torch fa4; do
  i=$((i + 1))
  OMP_NUM_THREADS=1 python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 --min-response 1 \
    --micro 16 --gas 4 --workdir "$W/${impl}_$i" --cases rmpad_compiled --rounds 1 --steps 3 --budget 32768 \
    --checkpointing off --adam fused --infer --flash-attention "$impl" --out "$W/t_$i.tsv" > "$W/log_$i.txt" 2>&1
  rc=$?
  echo "$i $impl rc=$rc $(grep -h '^# round' "$W/log_$i.txt")" | tee -a "$O/summary.txt"
  [ $rc -eq 0 ] || tail -30 "$W/log_$i.txt" >> "$O/summary.txt"
  for f in "$W/${impl}_$i"/run_*/rmpad_compiled_*.json; do echo "$i $impl $(cat "$f")"; done >> "$O/results.jsonl"
done
