#!/usr/bin/env bash
# The ZeRO-1/2 crossover gate (verl's seed command line with verl -> repro):
#   SEEDS="7777 8888" STEPS=60 RUN_TAG=my_gate VERL_DS_ZERO2_STEP_EACH_MICRO=0 \
#     bash scripts/bench/run_ds_zero12_seed_gate_bench.sh [-- base args]
# VERL_DS_ZERO2_STEP_EACH_MICRO=0 or 1 runs that step mode only; unset runs both and adds the
# mode-1-minus-mode-0 comparison. Writes outputs/<RUN_TAG>_<timestamp>/summary.tsv,
# compare.tsv, overall.tsv and <seed>/<case>/train.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}"
exec "$PY" -m repro.bench crossover --seeds "${SEEDS:-7777}" --steps "${STEPS:-60}" \
  --step-modes "${VERL_DS_ZERO2_STEP_EACH_MICRO:-0,1}" \
  --run-tag "${RUN_TAG:-ds_zero12_seed_gate}" --outputs-root "${OUTPUTS_ROOT:-outputs}" "$@"
