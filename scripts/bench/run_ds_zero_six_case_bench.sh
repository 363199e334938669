#!/usr/bin/env bash
# The six-case ZeRO benchmark (verl's seed command line with verl -> repro):
#   SEED=7777 STEPS=60 RUN_TAG=my_run bash scripts/bench/run_ds_zero_six_case_bench.sh [-- base args]
# Writes outputs/<RUN_TAG>_<timestamp>/summary.tsv and <case>/train.log. The VERL_DS_* and
# VERL_ENABLE_PARAM_OFFLOAD knobs pass through the environment to every run; PYTHON picks the
# interpreter (default: .venv/bin/python when present, else python).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}"
exec "$PY" -m repro.bench six-case --seed "${SEED:-7777}" --steps "${STEPS:-60}" \
  --run-tag "${RUN_TAG:-ds_zero_six_case}" --outputs-root "${OUTPUTS_ROOT:-outputs}" "$@"
