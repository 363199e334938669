# Sourced by issue 35's device scripts of session 16 (results/actor_update/s16*_device.sh), from the tree's root:
# sets O (the call's $OUT), checks that the wheels were installed to /tmp/site (a bg job runs from a copy of the
# tree without them: the device call installs them first), exports the settings every device run needs
# (the device machine's own: DeepSpeed's JIT arch, NVLink multicast off) and writes $O/env.txt (date, GPU, CPU, versions).
O=${OUT:-/tmp/out}
mkdir -p "$O"
[ -d /tmp/site/deepspeed ] || { echo "no /tmp/site/deepspeed: pip install .whl/*.whl --target /tmp/site first" >&2; exit 2; }
export PYTHONPATH=/tmp/site:$PWD TORCH_CUDA_ARCH_LIST=9.0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -m1 'Model name'
  python3 -c "import torch, transformers, deepspeed; print(torch.__version__, transformers.__version__, deepspeed.__version__)"
} > "$O/env.txt" 2>&1
