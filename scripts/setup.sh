#!/usr/bin/env bash
# Create or refresh .venv with everything repro needs, then print nothing more than a summary.
# Safe to run again: it skips the install when pyproject.toml, the constraints and this script
# are unchanged since the last successful run.
#
#   REPRO_PYTHON   interpreter to build the venv from (default: python3)
#   REPRO_VENV     venv directory (default: .venv)
# On a machine that already has a CUDA torch (the GPU machine), install into that environment
# instead: `pip install -e '.[dev]'` there; this script is for CPU machines and CI.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${REPRO_VENV:-.venv}
py=${REPRO_PYTHON:-python3}
stamp_src=$(cat pyproject.toml constraints/cpu.txt scripts/setup.sh | sha256sum | cut -c1-16)
if [[ -f "$venv/.repro-setup" && "$(cat "$venv/.repro-setup")" == "$stamp_src" ]]; then
  echo "setup: $venv is up to date"
  exit 0
fi
[[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip)
"${pip[@]}" install -q --upgrade pip
# The CPU build of torch 2.13.0 is what CI and the tests use; never let a dependency pull a CUDA
# build (several GB): install torch first, pinned, and constrain it afterwards.
if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  "${pip[@]}" install -q "torch==2.13.0"
fi
# Read from the installed metadata: importing torch before numpy is installed prints
# "Failed to initialize NumPy", which is noise on a first setup.
torch_version=$("$venv/bin/python" -c 'from importlib.metadata import version; print(version("torch").split("+")[0])')
# DeepSpeed is built from its sdist: DS_BUILD_OPS=0 keeps it from compiling ops at install time
# (ops it needs are JIT-built on first use, and the fast suites use none).
DS_BUILD_OPS=0 "${pip[@]}" install -q -c constraints/cpu.txt "torch==$torch_version" -e '.[dev]'
echo "$stamp_src" > "$venv/.repro-setup"
"$venv/bin/python" - <<'PY'
import deepspeed, ray, torch, transformers
print(f"setup: torch {torch.__version__}, deepspeed {deepspeed.__version__}, "
      f"transformers {transformers.__version__}, ray {ray.__version__}")
PY
