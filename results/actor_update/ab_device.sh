#!/usr/bin/env bash
# Issue 35's A/B of two trees on one GPU: the 0.6B actor update (python -m repro.bench.rmpad --host-ops) under the
# repro package of another commit (A) and of this tree (B), A B B A, at each token budget given. Made for the sync
# fixes after 49e2631 (batching.select's one index copy per device, varlen's total on the device): their time and
# their sync count against the tree that measured 65 syncs (results/actor_update/README.md, session 13).
#
# Before the device call, here (the folder kept out of git, so that it travels only when carried):
#   rm -rf .ab_before && mkdir .ab_before && git archive 49e2631 repro | tar -x -C .ab_before
#   grep -qx /.ab_before/ .git/info/exclude || echo /.ab_before/ >> .git/info/exclude
# The device call (one H100), carrying [".whl", ".ab_before"]:   bash results/actor_update/ab_device.sh 0 16384
# In the background across device calls, run it from a private copy of the tree (e.g. the `bg` jobs' /tmp/plan/tree of
# scripts/seed_scale.sh): each call refreshes the working tree, and a run whose folder was replaced dies in
# os.getcwd() (session 14's first attempt). ORDER="after before before after" runs B A A B: if the middle runs are slower whatever their tree, A B B A's verdict
# was the order's. Each run's .tsv and .log land in $OUT as soon as they exist; the bench's model folder is shared by all runs.
# PIN=0-7 runs every process on those cores (taskset): whether the between-process spread is the host's placement.
set -u
budgets=("${@:-0}")
[ -d .ab_before/repro ] || { echo "no .ab_before/repro: make it with git archive (see the header)" >&2; exit 2; }
[ -d /tmp/site/deepspeed ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export TORCH_CUDA_ARCH_LIST=9.0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}
mkdir -p "$O"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -m1 'Model name'; } > "$O/env.txt" 2>&1
for b in "${budgets[@]}"; do
  n=0
  for side in ${ORDER:-before after after before}; do  # A B B A unless ORDER says otherwise (B A A B: the position control)
    n=$((n + 1))
    root=$PWD; [ "$side" = before ] && root=$PWD/.ab_before
    # From $root: `python -m` puts the working directory first on sys.path, and the bench's per-case child
    # process inherits both, so every import of repro comes from $root.
    (cd "$root" && PYTHONPATH=/tmp/site:$root ${PIN:+taskset -c "$PIN"} python3 -m repro.bench.rmpad --shape qwen3-0.6b --cases rmpad --rounds 1 \
      --workdir /tmp/ab_work --host-ops --budget "$b" --out "$O/b${b}_${n}_$side.tsv") > "$O/b${b}_${n}_$side.log" 2>&1
    echo "budget $b run $n ($side): rc=$? $(tail -1 "$O/b${b}_${n}_$side.tsv" 2>/dev/null)"
  done
done
