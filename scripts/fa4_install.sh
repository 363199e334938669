#!/usr/bin/env bash
# On the GPU machine: installs the FlashAttention-4 payload of scripts/fa4_wheels.sh into /tmp/site (no network there).
# Expects the first part of the CUDA 13 libraries in /tmp/chunks/ (copied there by the call that carried .whl4) and
# .whl5 in the tree (this call's carry); the wheels in .whl5/maybe only where the image lacks the module. Does nothing
# once flash_attn is installed (a warm machine). Callers add /tmp/site/nvidia_cutlass_dsl/dsl_packages to PYTHONPATH:
# pip --target does not run the .pth that would.
#   bash scripts/fa4_install.sh
set -euo pipefail
[ ! -d /tmp/site/flash_attn ] || exit 0
cu13=/tmp/chunks/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl
cat /tmp/chunks/cu13.part.aa .whl5/cu13.part.ab > "$cu13"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl5/fa4/*.whl "$cu13"
for pair in cuda.bindings:cuda_bindings cuda.pathfinder:cuda_pathfinder einops:einops google.protobuf:protobuf; do
  python3 -c "import ${pair%%:*}" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --no-compile \
    --target /tmp/site .whl5/maybe/${pair##*:}-*.whl
done
