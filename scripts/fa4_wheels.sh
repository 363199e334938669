#!/usr/bin/env bash
# The FlashAttention-4 payload for the GPU machine (no network there; one device call carries 64 MiB with the tree):
# flash-attn-4 with its requirements as wheels for its Python 3.12 / x86_64 / CUDA 13 image, split over two
# git-ignored folders. .whl4: the first 56 MB of nvidia-cutlass-dsl-libs-cu13 (92 MB); .whl5: the rest of it,
# the other wheels in fa4/, and in maybe/ those the image may already hold (scripts/fa4_install.sh installs them
# on the device only where an import fails). The versions are those run on an H200 in session 25
# (results/actor_update/README.md). Run from the project root on a machine that reaches PyPI (about 20 s):
#   bash scripts/fa4_wheels.sh
set -euo pipefail
PIP=${PIP:-.venv/bin/pip}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
get() {  # wheels for the device's interpreter, never their dependencies (each is listed here)
  "$PIP" download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$1" "${@:2}"
}
rm -rf .whl4 .whl5
mkdir -p .whl4 .whl5/fa4 .whl5/maybe
get .whl5/fa4 flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
  nvidia-cutlass-dsl-libs-core==4.8.1 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 quack-kernels==0.6.5
get .whl5/maybe cuda-bindings==13.5.0 cuda-pathfinder==1.9.1 einops==0.8.1 protobuf==6.33.6
get "$tmp" nvidia-cutlass-dsl-libs-cu13==4.8.1
split -b 56000000 "$tmp"/nvidia_cutlass_dsl_libs_cu13-4.8.1-*.whl "$tmp/cu13.part."
mv "$tmp/cu13.part.aa" .whl4/ && mv "$tmp/cu13.part.ab" .whl5/
[ ! -e "$tmp/cu13.part.ac" ] || { echo "the CUDA 13 libraries need a third part" >&2; exit 1; }
du -sb .whl4 .whl5
