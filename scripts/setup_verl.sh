#!/usr/bin/env bash
# Create (once) .venv-verl for the verl parity tests (nox -s verl): torch as in scripts/setup.sh,
# then verl 0.9.1, DeepSpeed (for repro's verl engine) and exactly the packages in constraints/verl.txt, --no-deps (verl's own
# requirements pull vLLM-era pins and GPU stacks that its RL math never imports).
# Skips the install when constraints/verl.txt and this script are unchanged since the last build.
# Exits 75 after one line saying so when the package index cannot be reached (nothing built).
#
#   REPRO_PYTHON     interpreter to build the venv from (default: python3)
#   REPRO_VERL_VENV  venv directory (default: .venv-verl)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${REPRO_VERL_VENV:-.venv-verl}
py=${REPRO_PYTHON:-python3}
stamp_src=$(cat constraints/verl.txt scripts/setup_verl.sh | sha256sum | cut -c1-16)
if [[ -f "$venv/.repro-setup" && "$(cat "$venv/.repro-setup")" == "$stamp_src" ]]; then
  echo "setup_verl: $venv is up to date"
  exit 0
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
if ! "$py" -m pip download -q --no-deps --dest "$probe" verl==0.9.1 >"$probe/log" 2>&1; then
  echo "setup_verl: package index unreachable (pip download verl==0.9.1 failed: $(tail -n 1 "$probe/log"))"
  exit 75
fi
[[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip)
if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  "${pip[@]}" install -q "torch==2.13.0"
fi
# DeepSpeed comes as an sdist: DS_BUILD_OPS=0 builds it without compiling any op (the CPU tests use
# DeepSpeed's torch Adam and gloo, see repro/cluster/process_group.py).
DS_BUILD_OPS=0 "${pip[@]}" install -q --no-deps -r constraints/verl.txt
"$venv/bin/python" -W ignore -c "import verl.trainer.ppo.core_algos, verl.trainer.ppo.metric_utils, verl.trainer.ppo.ray_trainer, verl.utils.reward_score.gsm8k"
# repro's verl engine (this checkout on the path, as nox -s verl runs it): the plugin imports and registers.
DS_ACCELERATOR=cpu PYTHONPATH="$PWD" "$venv/bin/python" -W ignore -c "import repro.integrations.verl.plugin, deepspeed"
echo "$stamp_src" > "$venv/.repro-setup"
"$venv/bin/python" -c 'import torch, transformers, verl; print(f"setup_verl: verl {verl.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")'
