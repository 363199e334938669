#!/usr/bin/env bash
# Issue 35, session 31, on CPU: the host operators an update issues per micro-batch, ZeRO-1 against ZeRO-2, with the
# decoder layers compiled (form C's rmpad_compiled) and eager (rmpad), at the narrow 0.6B shape (the 0.6B's 28 layers,
# 310 parameter tensors and vocabulary at a width a CPU runs: its --host-ops are the 0.6B's). One batch of 8 sequences
# (prompts up to 64, responses 1-128), split by the token budget into 1 micro-batch (4096) or 4 (256): the
# difference over 3 is what each further micro-batch costs the host. Rows land in raw/s31_cpu/<case>_z<stage>_b<budget>.json.
#   DS_ACCELERATOR=cpu bash results/actor_update/s31_host_ops_cpu.sh   (about 4 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=results/actor_update/raw/s31_cpu
mkdir -p "$out"
PY=${PYTHON:-.venv/bin/python}
for case in rmpad_compiled rmpad; do
  for zero in 2 1; do
    for budget in 4096 256; do
      w=$(mktemp -d)
      DS_ACCELERATOR=cpu OMP_NUM_THREADS=2 "$PY" -m repro.bench.rmpad --shape qwen3-0.6b-narrow --prompt 64 --response 128 \
        --min-response 1 --micro 4 --gas 2 --zero-stage $zero --cases $case --rounds 1 --steps 1 --warmup 1 \
        --budget $budget --checkpointing off --host-ops --workdir "$w" --out "$w/t.tsv" > "$w/log.txt" 2>&1
      cp "$w"/run_*/${case}_0.json "$out/${case}_z${zero}_b${budget}.json"
      rm -rf "$w"
    done
  done
done
"$PY" - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| layers | ZeRO | ops, 1 micro-batch | ops, 4 | each further micro-batch | of it DeepSpeed | autograd |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for case in ("rmpad_compiled", "rmpad"):
    for zero in (2, 1):
        one, four = (json.loads((out / f"{case}_z{zero}_b{b}.json").read_text()) for b in (4096, 256))
        per = lambda key=None: ((four["host_ops_by"].get(key, 0) - one["host_ops_by"].get(key, 0)) if key
                                else four["host_ops"] - one["host_ops"]) / 3
        print(f"| {'compiled' if case.endswith('compiled') else 'eager'} | {zero} | {one['host_ops']} | "
              f"{four['host_ops']} | {per():.0f} | {per('deepspeed'):.0f} | {per('autograd'):.0f} |")
PY
