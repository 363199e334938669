#!/usr/bin/env bash
# Issue 35's GPU check of session 12's changes, on one H100 (run in session 13 on GPU 3 of a 4-GPU lease, beside
# the policy build on GPU 0): the GPU test of torch's fused RMSNorm (repro/workers/rms_norm.py) first, then the
# fused kernel against transformers' eager norms in the 0.6B actor update, A B B A (fused, eager, eager, fused; one
# model folder), then one profiled rmpad update (phases.md only: the trace stays on the machine). Each result is
# written to $OUT as soon as it exists.
# Carry [".whl"]: Python 3.12 wheels of deepspeed 0.19.8 (no compiled ops), hjson, pydantic and their
# dependencies, which the device image lacks; no Ray needed.
set -u
n=0
[ -d /tmp/site/deepspeed ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD TORCH_CUDA_ARCH_LIST=9.0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, transformers, deepspeed; print(torch.__version__, transformers.__version__, deepspeed.__version__)"
} > "$O/env.txt" 2>&1
REPRO_GPU_TESTS=1 REPRO_REQUIRE_GPU=1 python3 -m pytest tests/gpu_e2e/test_rms_norm_gpu.py -m gpu -q \
  -p no:cacheprovider > "$O/gpu_test.log" 2>&1
W=/tmp/rmpad_work
for form in fused eager eager fused; do  # A B B A, one model folder
  n=$((n + 1))
  python3 -m repro.bench.rmpad --shape qwen3-0.6b --cases rmpad --rounds 1 --workdir $W --norms $form --host-ops \
    --out "$O/rmpad_${n}_$form.tsv" > "$O/rmpad_${n}_$form.log" 2>&1
done
python3 -m repro.bench.rmpad --shape qwen3-0.6b --cases rmpad --rounds 1 --steps 1 --workdir $W \
  --profile /tmp/rmpad_prof > "$O/profile.log" 2>&1
cp /tmp/rmpad_prof/*/phases.md "$O/" 2>/dev/null
tail -n 3 "$O"/*.log
