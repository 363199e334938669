#!/usr/bin/env bash
# The seed-scale runs on a 2-GPU machine (results/seed_scale/), one phase per device command so each
# stays under the 10-minute limit; state lives under /tmp between commands of one warm machine.
#
#   bash scripts/seed_scale.sh build         # the qwen3-0.6b-arith policy (SFT on GPU 0), cached in $REPRO_CACHE_DIR
#   bash scripts/seed_scale.sh run [SEED]    # python -m repro.main_ppo -cn grpo_0p6b (60 steps, vLLM, ZeRO-2);
#                                            # run again after a cut-off: it resumes from its last checkpoint (every SAVE_FREQ=10 steps)
#   bash scripts/seed_scale.sh gate          # the 0.6B gate case of nox -s gpu_e2e (pytest output in $OUT)
#   bash scripts/seed_scale.sh six CASES STEPS [SEED] [KEY=VALUE ...]  # python -m repro.bench six-case on -cn grpo_0p6b
#                                            # (validation off unless VAL=1: the bench compares memory, speed and score)
#   bash scripts/seed_scale.sh four ZERO SP STEPS [KEY=VALUE ...]  # 4 GPUs: the seed's dp x sp layout example
#                                            # (mini-batch 128, micro 16 for the update and the log-prob pass, token budgets off;
#                                            # SP=1 is dp=4, SP=2 is dp=2 x sp=2; results/4gpu/ ran it with log-prob micro 1)
#                                            # RUN_NAME=... names its run folder and files (default four_zeroZERO_spSP): a
#                                            # variant (LoRA, ZeRO-3 knobs) gets its own, not the plain run's to resume
#   bash scripts/seed_scale.sh sp ZERO SP STEPS [KEY=VALUE ...]  # 2 GPUs: the preset with Ulysses sp=SP (dp = 2 / SP),
#                                            # data and trainer seed 1, validation off (as the six-case runs)
#   bash scripts/seed_scale.sh peers PEER STEPS   # python -m repro.bench.peers --recipe seed (2 GPUs) for one peer into
#                                            # $REPRO_OUTPUTS_DIR/peers; `peers collect` writes the table of all peers there
#                                            # (TRL_SITE: the folder holding TRL's wheels, kept off verl's path:
#                                            # verl's FSDP worker imports TRL whenever it can, and TRL 1.16 breaks it)
#   bash scripts/seed_scale.sh abba PEER_A PEER_B STEPS  # two peers in both orders (A B, then B A), each round into its own
#                                            # $REPRO_OUTPUTS_DIR/roundN/peers (and $OUT/roundN), each round's table collected
#   bash scripts/seed_scale.sh verl ENGINE ZERO STEPS NAME [KEY=VALUE ...]  # verl's own trainer on the seed recipe
#                                            # (python -m repro.integrations.verl.e2e --recipe seed --engine ENGINE: deepspeed
#                                            # is repro's engine, dp verl's FSDP2) into $REPRO_OUTPUTS_DIR/verl/NAME; extra keys are
#                                            # verl's (trainer.n_gpus_per_node=1 for dp=1, ...deepspeed.ulysses_sequence_parallel_size=2)
#   bash scripts/seed_scale.sh vfour ZERO SP STEPS [KEY=VALUE ...]  # 4 GPUs: the four phase's keys in verl's trainer with
#                                            # repro's engine (the verl phase; vLLM eager; run folder vfour_zeroZERO_spSP)
#   bash scripts/seed_scale.sh splen LENGTHS [BENCH ARGS ...]  # 2 GPUs: python -m repro.bench.workers at the 0.6B shape,
#                                            # one sample a micro-batch of each length (comma-separated tokens), Ulysses
#                                            # sp=1 (dp=2) then sp=2 (dp=1): where sp=1 runs out of memory and sp=2 fits
#                                            # (e.g. --no-gradient-checkpointing); one TSV row or the OOM line per run
#   bash scripts/seed_scale.sh script PATH [ARGS ...]  # a device script of the tree (results/*/*_device.sh) as a phase:
#                                            # `bash PATH ARGS` with this phase's $OUT and GPUS, its output in $OUT/NAME.log;
#                                            # under bg it runs from the private copy, chained with the other jobs
#   bash scripts/seed_scale.sh bg NAME [after=A,B] PHASE ARGS...  # PHASE started in the background (setsid: it
#                                            # outlives the device call) from a private copy of the tree ($PLAN_DIR/tree,
#                                            # made once), after jobs A and B ended; its $OUT is $PLAN_DIR/NAME
#   bash scripts/seed_scale.sh poll [SECONDS]  # wait (default 540 s) until every bg job ended, print each one's exit
#                                            # code and last line, bring $PLAN_DIR back as $OUT/plan.tar.gz (PLAN_DIR: /tmp/plan)
#                                            # and the runs' small output files so far as $OUT/outputs.tar.gz
#   bash scripts/seed_scale.sh crossover SEED CASES STEPS  # python -m repro.bench crossover --step-modes 0 on -cn grpo_0p6b
#                                            # (one seed per command; `--collect` summarises the seeds together afterwards)
#
# On a 4-GPU machine two phases run side by side, each on its own pair: GPUS=0,1 and GPUS=2,3.
# Each phase stops itself (SIGTERM, then SIGKILL 20 s later) well inside the device's 600 s call limit: a
# command cut by that limit loses the machine and everything under /tmp. DEADLINE (epoch seconds) shortens
# each phase's limit so that phases chained in one command all end by then.
# A phase left running in the background across device calls must run from a private copy of the tree (the bg phase):
# each call refreshes the working tree, and a run importing from it then can fail (results/4gpu/README.md, third lease).
# TRACE=NAME on any phase: every collective of the run's ranks is traced in check mode (REPRO_COLLECTIVES_CHECK,
# default every) into $REPRO_OUTPUTS_DIR/trace_NAME; its `analyze` report is kept as $OUT/trace_NAME.txt.
# Expects the project on PYTHONPATH with DeepSpeed, Ray, Hydra and vLLM importable (shared wheels), and $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export REPRO_CACHE_DIR=${REPRO_CACHE_DIR:-/tmp/rcache} REPRO_OUTPUTS_DIR=${REPRO_OUTPUTS_DIR:-/tmp/routs}
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_USE_FLASHINFER_SAMPLER=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" "$REPRO_OUTPUTS_DIR"
PY=${PY:-python3}
[ -n "${GPUS:-}" ] && export CUDA_VISIBLE_DEVICES=$GPUS
if [ -n "${TRACE:-}" ]; then
  # repro's init_distributed installs the trace from these in every rank (Ray's workers inherit them).
  export REPRO_COLLECTIVES_TRACE=$REPRO_OUTPUTS_DIR/trace_$TRACE REPRO_COLLECTIVES_CHECK=${TRACE_CHECK:-every}
  trap '$PY -m repro.collectives_trace analyze "$REPRO_COLLECTIVES_TRACE" > "$OUT/trace_$TRACE.txt" 2>&1; echo "trace $TRACE analyze rc=$?"; tail -2 "$OUT/trace_$TRACE.txt"' EXIT
fi
limit() {  # seconds this phase may run: its default, or less so that it ends by $DEADLINE
  local want=$1
  if [ -n "${DEADLINE:-}" ]; then local left=$(( DEADLINE - $(date +%s) - 25 )); [ "$left" -lt "$want" ] && want=$left; fi
  [ "$want" -gt 30 ] && echo "$want" || echo 30
}
keep() {  # the files a run leaves, in one archive (a device command brings back few files)
  local dir=$1 name=$2
  tar -czf "$OUT/$name.tar.gz" -C "$(dirname "$dir")" --exclude checkpoints "$(basename "$dir")" 2>/dev/null
  cp "$dir"/summary.tsv "$OUT/$name.summary.tsv" 2>/dev/null
  true
}
# The seed's 4-GPU example keys (mini-batch 128, micro 16 for the update and the log-prob pass, token budgets off):
# one list for repro's trainer (four) and verl's with repro's engine (vfour).
FOUR_KEYS=(trainer.n_gpus_per_node=4 data.train_batch_size=128 actor_rollout_ref.actor.ppo_mini_batch_size=128
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 actor_rollout_ref.actor.use_dynamic_bsz=False
  actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=False actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16)
case "${1:-}" in
  build)
    { nvidia-smi --query-gpu=name,memory.total --format=csv; $PY -c 'import torch, transformers, deepspeed; print(torch.__version__, transformers.__version__, deepspeed.__version__)'; } > "$OUT/versions.txt" 2>&1
    # DeepSpeed's JIT ops, built once beside the policy (on the CPU) so that no timed run pays for them.
    $PY -c 'from deepspeed.ops.op_builder import CPUAdamBuilder, FusedAdamBuilder; FusedAdamBuilder().load(); CPUAdamBuilder().load()' \
      > "$OUT/jit_ops.log" 2>&1 & jit=$!
    { time $PY -m repro.data policy qwen3-0.6b-arith; } > "$OUT/build.log" 2>&1
    echo "build rc=$?"; tail -4 "$OUT/build.log"; wait $jit; echo "jit ops rc=$?"
    ;;
  run)
    seed=${2:-1}; dir=$REPRO_OUTPUTS_DIR/grpo_0p6b_seed$seed
    timeout -k 20 "$(limit "${RUN_TIMEOUT:-540}")" $PY -m repro.main_ppo -cn grpo_0p6b trainer.seed="$seed" trainer.save_freq=${SAVE_FREQ:-10} \
      trainer.max_actor_ckpt_to_keep=1 trainer.progress=plain trainer.output_dir="$dir" "${@:3}" >> "$OUT/run_seed$seed.log" 2>&1
    echo "run rc=$?"; tail -5 "$OUT/run_seed$seed.log"; keep "$dir" "grpo_0p6b_seed$seed"
    ;;
  gate)
    REPRO_GPU_TESTS=1 REPRO_REQUIRE_GPU=1 REPRO_GATE_OUT="$REPRO_OUTPUTS_DIR/gate" timeout -k 20 "$(limit "${GATE_TIMEOUT:-540}")" \
      $PY -m pytest tests/gpu_e2e -m gpu -k 0p6b_policy -v -s -p no:cacheprovider "${@:2}" > "$OUT/gate_pytest.log" 2>&1
    echo "gate rc=$?"; tail -5 "$OUT/gate_pytest.log"
    for d in "$REPRO_OUTPUTS_DIR"/gate/*/; do [ -d "$d" ] && keep "${d%/}" "gate_$(basename "$d")"; done
    ;;
  six)
    cases=${2:?cases}; steps=${3:?steps}; seed=${4:-1}; tag="six_${cases//,/_}_s$seed"
    val=(trainer.val_before_train=False trainer.test_freq=-1); [ "${VAL:-0}" = 1 ] && val=()
    timeout -k 20 "$(limit "${SIX_TIMEOUT:-540}")" $PY -m repro.bench six-case --cases "$cases" --steps "$steps" --seed "$seed" \
      --retries 0 --run-tag "$tag" --outputs-root "$REPRO_OUTPUTS_DIR" -- -cn grpo_0p6b "${val[@]}" "${@:5}" >> "$OUT/$tag.log" 2>&1
    echo "$tag rc=$?"; tail -4 "$OUT/$tag.log"
    for d in "$REPRO_OUTPUTS_DIR/$tag"_*/; do [ -d "$d" ] && keep "${d%/}" "$(basename "$d")"; done
    ;;
  four)
    zero=${2:?zero stage}; sp=${3:?sp}; steps=${4:?steps}; name=${RUN_NAME:-four_zero${zero}_sp$sp}; dir=$REPRO_OUTPUTS_DIR/$name
    timeout -k 20 "$(limit "${RUN_TIMEOUT:-540}")" $PY -m repro.main_ppo -cn grpo_0p6b "${FOUR_KEYS[@]}" \
      actor_rollout_ref.actor.ulysses_sequence_parallel_size="$sp" actor_rollout_ref.actor.deepspeed.zero_stage="$zero" \
      trainer.total_training_steps="$steps" trainer.val_before_train=False trainer.test_freq=-1 trainer.progress=plain \
      trainer.output_dir="$dir" "${@:5}" >> "$OUT/$name.log" 2>&1
    echo "$name rc=$?"; tail -3 "$OUT/$name.log"; keep "$dir" "$name"
    ;;
  sp)
    zero=${2:?zero stage}; sp=${3:?sp}; steps=${4:?steps}; name=${RUN_NAME:-sp${sp}_zero$zero}; dir=$REPRO_OUTPUTS_DIR/${name}_s1
    timeout -k 20 "$(limit "${RUN_TIMEOUT:-540}")" $PY -m repro.main_ppo -cn grpo_0p6b trainer.seed=1 data.seed=1 \
      actor_rollout_ref.actor.ulysses_sequence_parallel_size="$sp" actor_rollout_ref.actor.deepspeed.zero_stage="$zero" \
      trainer.total_training_steps="$steps" trainer.val_before_train=False trainer.test_freq=-1 trainer.progress=plain \
      trainer.resume_mode=disable trainer.output_dir="$dir" "${@:5}" >> "$OUT/$name.log" 2>&1
    echo "$name rc=$?"; tail -3 "$OUT/$name.log"; keep "$dir" "$name"
    ;;
  peers)
    peer=${2:?peer or collect}; dir=$REPRO_OUTPUTS_DIR/peers
    if [ "$peer" = collect ]; then
      $PY -m repro.bench.peers --recipe seed --collect --out "$dir" > "$OUT/peers_table.log" 2>&1; echo "collect rc=$?"
      cp "$dir"/table.md "$dir"/peers.json "$OUT"/ 2>/dev/null; exit 0
    fi
    steps=${3:?steps}; lim=$(limit "${PEER_TIMEOUT:-540}")
    # The bench stops the peer 30 s before this phase's limit, so that it still writes the peer's summary.
    timeout -k 20 "$lim" $PY -m repro.bench.peers --recipe seed --peers "$peer" --steps "$steps" --out "$dir" \
      --timeout $(( lim - 30 )) --trl-pythonpath "${TRL_SITE:-}" >> "$OUT/peers_$peer.log" 2>&1
    echo "peers $peer rc=$?"; tail -2 "$OUT/peers_$peer.log"; keep "$dir/$peer" "peers_$peer"
    ;;
  abba)
    a=${2:?peer A}; b=${3:?peer B}; steps=${4:?steps}; base=$REPRO_OUTPUTS_DIR
    for spec in 1:$a 1:$b 2:$b 2:$a; do
      REPRO_OUTPUTS_DIR=$base/round${spec%%:*} OUT=$OUT/round${spec%%:*} bash scripts/seed_scale.sh peers "${spec#*:}" "$steps"
    done
    for r in 1 2; do REPRO_OUTPUTS_DIR=$base/round$r OUT=$OUT/round$r bash scripts/seed_scale.sh peers collect; done
    ;;
  verl)
    engine=${2:?deepspeed or dp}; zero=${3:?zero stage}; steps=${4:?steps}; name=${5:?run name}; dir=$REPRO_OUTPUTS_DIR/verl/$name
    timeout -k 20 "$(limit "${RUN_TIMEOUT:-540}")" $PY -m repro.integrations.verl.e2e --recipe seed --engine "$engine" \
      --zero-stage "$zero" --steps "$steps" --run-dir "$dir" "${@:6}" >> "$OUT/verl_$name.log" 2>&1
    echo "verl $name rc=$?"; tail -2 "$OUT/verl_$name.log"; keep "$dir" "verl_$name"
    ;;
  vfour)
    # verl's own start-up (Ray, four vLLM servers) took over 4 minutes with CUDA-graph capture (results/4gpu/):
    # eager vLLM here, so that a 540 s call holds the steps.
    zero=${2:?zero stage}; sp=${3:?sp}; steps=${4:?steps}
    bash scripts/seed_scale.sh verl deepspeed "$zero" "$steps" "${RUN_NAME:-vfour_zero${zero}_sp$sp}" "${FOUR_KEYS[@]}" \
      actor_rollout_ref.actor.deepspeed.ulysses_sequence_parallel_size="$sp" actor_rollout_ref.rollout.enforce_eager=True "${@:5}"
    ;;
  splen)
    lengths=${2:?lengths}; w=$REPRO_OUTPUTS_DIR/splen; tag=${SPLEN_TAG:-splen}
    for seq in ${lengths//,/ }; do for sp in 1 2; do
      name=${tag}_sp${sp}_$seq
      timeout -k 20 "$(limit 300)" $PY -m repro.bench.workers --shape "${SHAPE:-qwen3-0.6b}" --nproc 2 --sp "$sp" --cases zero2 \
        --runners worker --micro 1 --gas 1 --seq "$seq" --steps 2 --warmup 1 --workdir "$w" --out "$OUT/$name.tsv" \
        "${@:3}" > "$OUT/$name.log" 2>&1
      echo "$name rc=$? $(tail -1 "$OUT/$name.tsv" 2>/dev/null) $(grep -m1 -o 'OutOfMemoryError: CUDA out of memory. Tried to allocate [^(]*' "$OUT/$name.log")"
    done; done
    ;;
  script)
    path=${2:?script path}; log=$OUT/$(basename "$path" .sh).log
    [ -f "$path" ] || { echo "script: $path is not a file of $PWD" >&2; exit 2; }
    OUT=$OUT timeout -k 20 "$(limit "${SCRIPT_TIMEOUT:-540}")" bash "$path" "${@:3}" > "$log" 2>&1
    echo "script $path rc=$?"; tail -3 "$log"
    ;;
  bg)
    name=${2:?job name}; shift 2; after=""
    case "${1:-}" in after=*) after=${1#after=}; shift ;; esac
    [ $# -gt 0 ] || { echo "bg $name: no phase given" >&2; exit 2; }
    plan=${PLAN_DIR:-/tmp/plan}; root=$PWD; mkdir -p "$plan/$name"
    if [ ! -d "$plan/tree" ]; then  # once per machine: later device calls refresh $root under running jobs
      mkdir -p "$plan/tree.part" && tar -cf - --exclude=./.git --exclude='./.venv*' --exclude='./.vc*' --exclude='./.whl*' \
        --exclude=./.nox --exclude='*/__pycache__' . | tar -xf - -C "$plan/tree.part" && mv "$plan/tree.part" "$plan/tree"
    fi
    # The job's Python finds repro in the copy: the tree's path in PYTHONPATH becomes the copy's (Ray's workers inherit it).
    OUT=$plan/$name PYTHONPATH=${PYTHONPATH:+${PYTHONPATH//$root/$plan/tree}} setsid nohup bash -c '
      plan=$0 name=$1 after=$2; shift 2
      for dep in ${after//,/ }; do until [ -e "$plan/$dep.rc" ]; do sleep 1; done; done
      echo "$(date +%T) $name from $plan/tree: $*"
      cd "$plan/tree" && bash scripts/seed_scale.sh "$@"; rc=$?
      echo "$(date +%T) $name rc=$rc"; echo $rc > "$plan/$name.rc"' "$plan" "$name" "$after" "$@" > "$plan/$name.log" 2>&1 < /dev/null &
    echo "bg $name started${after:+ after $after}: $*"
    ;;
  poll)
    plan=${PLAN_DIR:-/tmp/plan}; wait_s=${2:-540}; t0=$(date +%s); shopt -s nullglob
    while [ $(( $(date +%s) - t0 )) -lt "$wait_s" ]; do
      left=0; for log in "$plan"/*.log; do [ -e "${log%.log}.rc" ] || left=$(( left + 1 )); done
      [ "$left" = 0 ] && break; sleep 1
    done
    for log in "$plan"/*.log; do n=$(basename "${log%.log}"); echo "$n: rc=$(cat "$plan/$n.rc" 2>/dev/null || echo running) | $(tail -1 "$log")"; done
    items=(); for f in "$plan"/*; do [ "$(basename "$f")" = tree ] || items+=("$(basename "$f")"); done
    [ ${#items[@]} -gt 0 ] && tar -czf "$OUT/plan.tar.gz" -C "$plan" --exclude='*.pt' --exclude='*.trace.json' "${items[@]}"
    # The runs' own outputs so far (metrics, logs, summaries: files under 2 MB, no checkpoints or traces): the sixth
    # 4-GPU lease lost a run at step 13 with its machine, and with it every step it had logged (results/4gpu/README.md).
    (cd "$REPRO_OUTPUTS_DIR" && find . -type f -size -2M -not -path '*/checkpoints/*' -not -path './trace_*' -print0 \
      | tar -czf "$OUT/outputs.tar.gz" --null -T -) 2>/dev/null
    true
    ;;
  crossover)
    seed=${2:?seed}; cases=${3:?cases}; steps=${4:?steps}; tag="cross_${cases//,/_}_s$seed"
    timeout -k 20 "$(limit "${SIX_TIMEOUT:-540}")" $PY -m repro.bench crossover --seeds "$seed" --step-modes 0 --cases "$cases" \
      --steps "$steps" --retries 0 --run-tag "$tag" --outputs-root "$REPRO_OUTPUTS_DIR" -- -cn grpo_0p6b \
      trainer.val_before_train=False trainer.test_freq=-1 >> "$OUT/$tag.log" 2>&1
    echo "$tag rc=$?"; tail -4 "$OUT/$tag.log"
    for d in "$REPRO_OUTPUTS_DIR/$tag"_*/; do [ -d "$d" ] && keep "${d%/}" "$(basename "$d")"; done
    ;;
  *) echo "usage: bash scripts/seed_scale.sh build|run [SEED]|gate|six CASES STEPS [SEED]|four ZERO SP STEPS|sp ZERO SP STEPS|peers PEER STEPS|peers collect|abba PEER_A PEER_B STEPS|verl ENGINE ZERO STEPS NAME|vfour ZERO SP STEPS|splen LENGTHS|script PATH [ARGS]|bg NAME [after=A,B] PHASE ...|poll [SECONDS]|crossover SEED CASES STEPS" >&2; exit 2 ;;
esac
