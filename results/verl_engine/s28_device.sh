#!/usr/bin/env bash
# Session 28, one H200: repro's engine inside verl on packed rows (verl's use_remove_padding) through repro's varlen
# path, torch's FlashAttention-2 and FlashAttention-4, compiled layers too, against verl's FSDP2 engine on the same
# batches (python -m repro.integrations.verl.compare); then the CPU suites on this machine's CPU.
#
# Payload (all ignored folders of the checkout), five device calls back to back on one warm machine:
#   1. carry [".whl4", ".whl"] (tree without results/, fixtures/, repro/data/tiny_policy_weights/ but for this
#      script and device_env.sh): mkdir -p /tmp/chunks && cp .whl4/* /tmp/chunks/ &&
#        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   2. carry [".whl5"] (the same slim tree): bash scripts/fa4_install.sh
#   3. carry [".whl2", ".whl6"] (slim tree): cp .whl2/* /tmp/chunks/ && python3 -m pip install -q --no-index
#        --no-deps --no-compile --target /tmp/vsite .whl6/*.whl
#      .whl6 = verl 0.9.1 and what its engine imports that the image lacks, at the versions of CI's verl venv
#      (scripts/setup_verl.sh): transformers 5.10.4, tensordict 0.10.0, ... in /tmp/vsite, ahead of the image's
#      packages only for verl's runs.
#   4. carry [".whl3"] (slim tree): STAGE=compare OUT=$OUT bash results/verl_engine/s28_device.sh
#   5. whole tree, no carry: STAGE=cpu OUT=$OUT bash results/verl_engine/s28_device.sh (SUITES to choose)
# A second lease, after the varlen change: calls 1-3 again (.whl6 with fastapi, starlette and uvicorn added: verl's
# trainer imports them), 4. carry [".whl3", ".old"]: STAGE=compile ..., 5. STAGE=cpu SUITES=unit VERL=1 ...
set -u
START=$(date +%s)
if [ ! -d /tmp/site/ray ]; then
  cat /tmp/chunks/ray.part.aa .whl3/ray.part.ab > /tmp/chunks/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl &&
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
      /tmp/chunks/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl || exit 1
fi
source results/actor_update/device_env.sh
export PYTHONPATH=$PYTHONPATH:/tmp/site/nvidia_cutlass_dsl/dsl_packages
case "${STAGE:-compare}" in
  compare)
    # verl's packages first; then the checkout, /tmp/site (DeepSpeed, Ray, FA4) and FA4's DSL packages
    PYTHONPATH=/tmp/vsite:$PYTHONPATH python3 -c "import verl, transformers, tensordict, flash_attn.cute; \
print('verl', verl.__version__, 'transformers', transformers.__version__, 'tensordict', tensordict.__version__)" \
      >> "$O/env.txt" 2>&1
    PYTHONPATH=/tmp/vsite:$PYTHONPATH OMP_NUM_THREADS=4 timeout $(( ${BUDGET:-570} - ($(date +%s) - START) )) \
      python3 -m repro.integrations.verl.compare --shape qwen3-0.6b --steps "${STEPS:-8}" --out /tmp/cmp \
      --cases "${CASES:-fsdp2,ds-zero2-rmpad-fa4,ds-zero2-rmpad,ds-zero2,ds-zero2-rmpad-fa4-compiled}" \
      > "$O/compare.txt" 2>&1
    echo "compare rc=$? at $(( $(date +%s) - START )) s" | tee -a "$O/summary.txt"
    (cd /tmp/cmp && tar czf "$O/cmp.tgz" --exclude 'model-*' .)
    ;;
  compile)
    # after the boundaries moved out of the layers (repro/workers/varlen.py): the GPU test of compiled layers on the
    # varlen path, then the same test on the varlen.py before it (.old/, carried: it must fail), then verl's engine
    # again with dynamo's recompilations logged
    REPRO_GPU_TESTS=1 timeout 240 python3 -m pytest -q -s -p no:cacheprovider tests/gpu_e2e/test_layer_compile_gpu.py \
      > "$O/gpu_test.txt" 2>&1
    echo "gpu test rc=$? at $(( $(date +%s) - START )) s" | tee -a "$O/summary.txt"
    cp repro/workers/varlen.py /tmp/varlen_new.py && cp .old/varlen.py repro/workers/varlen.py
    REPRO_GPU_TESTS=1 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu_e2e/test_layer_compile_gpu.py \
      -k "varlen_path and torch" > "$O/gpu_test_old.txt" 2>&1
    echo "gpu test on the old varlen.py rc=$? at $(( $(date +%s) - START )) s" | tee -a "$O/summary.txt"
    cp /tmp/varlen_new.py repro/workers/varlen.py
    rm -rf /tmp/cmp2
    PYTHONPATH=/tmp/vsite:$PYTHONPATH OMP_NUM_THREADS=4 TORCH_LOGS=recompiles,graph_breaks \
      timeout $(( ${BUDGET:-570} - ($(date +%s) - START) )) python3 -m repro.integrations.verl.compare --shape qwen3-0.6b \
      --steps "${STEPS:-8}" --out /tmp/cmp2 --cases "${CASES:-fsdp2,ds-zero2-rmpad,ds-zero2-rmpad-fa4-compiled}" \
      > "$O/compare.txt" 2>&1
    echo "compare rc=$? at $(( $(date +%s) - START )) s" | tee -a "$O/summary.txt"
    (cd /tmp/cmp2 && tar czf "$O/cmp2.tgz" --exclude 'model-*' .)
    ;;
  cpu)
    # the CPU suites as CI runs them (DS_ACCELERATOR=cpu, gloo), this machine's CPU; verl's with its packages first
    REPRO_COMMIT=${REPRO_COMMIT:-} PYTHON=python3 JOBS=${JOBS:-14} OUT=$O/cpu \
      bash scripts/cpu_suite_elsewhere.sh ${SUITES:-unit slow} > /tmp/cpu.txt 2>&1
    echo "cpu ${SUITES:-unit slow} rc=$? at $(( $(date +%s) - START )) s" | tee -a "$O/summary.txt"
    if [ -n "${VERL:-}" ]; then
      PYTHONPATH=/tmp/vsite:$PYTHONPATH REPRO_COMMIT=${REPRO_COMMIT:-} PYTHON=python3 JOBS=${JOBS:-14} OUT=$O/cpuv \
        bash scripts/cpu_suite_elsewhere.sh verl > /tmp/cpuv.txt 2>&1
      echo "cpu verl rc=$? at $(( $(date +%s) - START )) s" | tee -a "$O/summary.txt"
    fi
    ;;
esac
