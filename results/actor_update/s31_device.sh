#!/usr/bin/env bash
# Issue 35, session 31, one GPU: where form C's update goes at small token budgets (session 30 measured it at 26.5-27.0%
# perf/mfu/actor at budget 8,192 against 47.8% at 32,768, the same tokens; not profiled then), and the CPU suites on
# this machine's CPU (session 28's gc-test mend and the verl suite were not rerun there).
# Session 32 reran its profile stage with other PROFILES (results/actor_update/README.md, "Session 32").
# STAGE=profile: form C (--cases rmpad_compiled --checkpointing off --adam fused --infer) once per PROFILES entry
#   KERNELS:BUDGET:ZERO (KERNELS torch = FA2 or fa4; ZERO the ZeRO stage, 2 as form C or 1: on CPU at the narrow shape
#   ZeRO-2 issues 3,307 host operators per extra micro-batch against ZeRO-1's 1,130, DeepSpeed's per-parameter copies
#   of each micro-batch's gradients, README "Session 31"), each in a fresh process, 10 timed updates, then one update and one
#   log-prob pass under torch.profiler (--profile: phases.md, the GPU's idle time by host op) and one more update with
#   --host-ops (operators and device syncs the host issues). Back: profiles.tgz (phases.md, the key-average tables,
#   the shape files; on a warm machine a later process of an entry overwrites an earlier one's folder), results.jsonl,
#   summary.txt, and the traces of the first two entries' profiled updates (gzipped) for the analysis here.
# STAGE=cpu: scripts/cpu_suite_elsewhere.sh SUITES (default unit slow), then with VERL=1 the verl suite alone, verl's
#   packages (/tmp/vsite) first on PYTHONPATH.
# Payload, calls back to back on one warm machine (results/, fixtures/ and repro/data/tiny_policy_weights/ moved aside
# in calls 1-4, all but this script and device_env.sh: the carried folders and the whole tree pass one call's 64 MiB):
#   1. carry [".whl4", ".whl"]: mkdir -p /tmp/chunks && cp .whl4/* /tmp/chunks/ &&
#        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   2. carry [".whl5"]: STAGE=profile OUT=$OUT bash results/actor_update/s31_device.sh
#   or, where device time allows one call only, FA2's entries alone, carry [".whl"]:
#     python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl &&
#       PROFILES="torch:8192:2 torch:8192:1 torch:32768:1" STAGE=profile OUT=$OUT bash results/actor_update/s31_device.sh
#   2b. no carry (warm): PROFILES="..." STAGE=profile OUT=$OUT bash results/actor_update/s31_device.sh
#   3. carry [".whl2"]: cp .whl2/* /tmp/chunks/
#   4. carry [".whl3"]: STAGE=install bash results/actor_update/s31_device.sh (the Ray wheel joined, into /tmp/site)
#   5. whole tree, carry [".whl6"]: STAGE=install bash results/actor_update/s31_device.sh &&
#        STAGE=cpu OUT=$OUT bash results/actor_update/s31_device.sh
#      (.whl6: verl 0.9.1 and the packages of constraints/verl.txt the image lacks, at those versions, into /tmp/vsite;
#      36 wheels, 27 MB: `pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
#      --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --dest .whl6`
#      of constraints/verl.txt's pins less the device image's own packages (numpy, pandas, pyarrow, pytest,
#      hypothesis, peft, accelerate, ...), their dependencies already in the image, and what .whl holds (deepspeed,
#      hydra-core, omegaconf, antlr4, hjson, pydantic, jsonschema) and Ray; stages install and cpu not yet run)
#   6. whole tree, no carry: STAGE=cpu SUITES= VERL=1 OUT=$OUT bash results/actor_update/s31_device.sh
set -u
START=$(date +%s)
BUDGET=${BUDGET:-570}
W=/tmp/s31_work
mkdir -p "$W"
case "${STAGE:-profile}" in
  install)
    # each half where this call carries it: the Ray wheel's second part (.whl3), verl's packages (.whl6)
    if [ -d .whl3 ] && [ ! -d /tmp/site/ray ]; then
      cat /tmp/chunks/ray.part.aa .whl3/ray.part.ab > /tmp/chunks/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl &&
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
          /tmp/chunks/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl || exit 1
    fi
    if [ -d .whl6 ] && [ ! -d /tmp/vsite/verl ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/vsite .whl6/*.whl || exit 1
      PYTHONPATH=/tmp/vsite:/tmp/site python3 -c "import verl, ray, transformers, tensordict, uvicorn; \
print('verl', verl.__version__, 'ray', ray.__version__, 'transformers', transformers.__version__)"
    fi
    exit $?
    ;;
esac
source results/actor_update/device_env.sh
echo "commit ${REPRO_COMMIT:-unknown}" >> "$O/env.txt"
case "${STAGE:-profile}" in
  profile)
    # FA4 only where this call or an earlier one on this machine brought .whl5 (entries of torch's kernels need none)
    [ -d .whl5 ] && bash scripts/fa4_install.sh
    DSL=/tmp/site/nvidia_cutlass_dsl/dsl_packages
    export PYTHONPATH=$PYTHONPATH:$DSL
    i=0
    for entry in ${PROFILES:-fa4:8192:2 fa4:8192:1 fa4:32768:1}; do
      IFS=: read -r impl budget zero <<< "$entry"
      left=$(( BUDGET - ($(date +%s) - START) ))
      [ $left -gt 120 ] || { echo "stopped before $entry: ${left} s left" >> "$O/summary.txt"; break; }
      i=$((i + 1))
      name="${impl}_${budget}_z${zero}"
      OMP_NUM_THREADS=1 timeout $left python3 -m repro.bench.rmpad --shape qwen3-0.6b --prompt 256 --response 512 \
        --min-response 1 --micro 16 --gas 4 --zero-stage "$zero" --workdir "$W/$name" --cases rmpad_compiled --rounds 1 --steps ${STEPS:-10} \
        --budget "$budget" --checkpointing off --adam fused --infer --flash-attention "$impl" \
        --profile "$W/prof/$name" --host-ops --out "$W/t_$name.tsv" > "$W/$name.txt" 2>&1
      rc=$?
      echo "$i $name rc=$rc at $(( $(date +%s) - START )) s $(grep -h '^# round' "$W/$name.txt")" | tee -a "$O/summary.txt"
      [ $rc -eq 0 ] || tail -30 "$W/$name.txt" >> "$O/summary.txt"
      # this process's run folder only: on a warm machine the workdir keeps the earlier calls' (session 31's calls 2
      # and 3 appended those rows again to their results.jsonl)
      run=$(ls -td "$W/$name"/run_* | head -1)
      for f in "$run"/rmpad_compiled_*.json; do echo "$name $(cat "$f")"; done >> "$O/results.jsonl"
      { echo "===== $name"; cat "$W/$name.txt"; cat "$run"/rmpad_compiled_*.log; } >> "$W/case_logs.txt"
    done
    (cd "$W" && tar czf "$O/profiles.tgz" --exclude '*.trace.json' prof case_logs.txt)
    # the traces of the first two entries' profiled updates, for the analysis here (each under 16 MiB gzipped)
    n=0
    for entry in ${PROFILES:-fa4:8192:2 fa4:8192:1}; do
      n=$((n + 1)); [ $n -le 2 ] || break
      IFS=: read -r impl budget zero <<< "$entry"
      t=$(ls "$W/prof/${impl}_${budget}_z${zero}"/rmpad_compiled_0/*.trace.json 2>/dev/null | head -1)
      [ -n "$t" ] && gzip -c "$t" > "$O/update_${impl}_${budget}_z${zero}.trace.json.gz"
    done
    ;;
  cpu)
    if [ -n "${SUITES-unit slow}" ]; then
      REPRO_COMMIT=${REPRO_COMMIT:-} PYTHON=python3 JOBS=${JOBS:-14} OUT=$O/cpu \
        bash scripts/cpu_suite_elsewhere.sh ${SUITES-unit slow} > "$O/cpu.txt" 2>&1
      echo "cpu ${SUITES-unit slow} rc=$? at $(( $(date +%s) - START )) s" | tee -a "$O/summary.txt"
    fi
    if [ -n "${VERL:-}" ]; then
      PYTHONPATH=/tmp/vsite:$PYTHONPATH REPRO_COMMIT=${REPRO_COMMIT:-} PYTHON=python3 JOBS=${JOBS:-14} OUT=$O/cpuv \
        timeout $(( BUDGET - ($(date +%s) - START) )) bash scripts/cpu_suite_elsewhere.sh verl > "$O/cpuv.txt" 2>&1
      echo "cpu verl rc=$? at $(( $(date +%s) - START )) s" | tee -a "$O/summary.txt"
    fi
    ;;
esac
