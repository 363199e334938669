"""Actor-update benchmark of remove-padding, chunked log-probs and LoRA on a batch with realistic lengths.

Every case trains the same randomly initialised model on the same batch with
``ActorWorker.update_policy`` (one optimizer step per call), one case per process (peak memory
would leak from one case into the next), cases alternated over ``--rounds`` so that ratios are
taken within one command:

- ``padded_full``: padded micro-batches, log-probs from one fp32 chunk of the whole micro-batch
  (the computation before ``repro.workers.logprob``);
- ``padded``: padded micro-batches, chunked log-probs;
- ``padded_dynbsz``: padded, chunked, token-budget micro-batches (``use_dynamic_bsz``) of
  ``--budget`` real tokens (default ``micro * (prompt + response)``, the padded case's memory):
  fewer, fuller micro-batches without packing;
- ``rmpad``: ``use_remove_padding`` with token-budget micro-batches of the same budget, chunked
  log-probs of the response positions only, and on CUDA FlashAttention over each micro-batch
  packed into one row (:mod:`repro.workers.varlen`);
- ``rmpad_sdpa``: the same without the varlen path: rows of the padded width under
  transformers' ``sdpa`` attention with its block-causal mask (what CPU runs use);
- ``rmpad_lora``: ``rmpad`` with LoRA (rank 8, all linear layers);
- ``rmpad_compiled``: ``rmpad`` with every decoder layer under ``torch.compile`` (``actor_rollout_ref.model.
  compile_layers`` set to ``--compile-backend``, inductor by default; :mod:`repro.workers.layer_compile`, ZeRO-1/2
  only), compiled in the warm-up update. Beside ``rmpad``
  in one command (``--cases rmpad,rmpad_compiled --rounds 3``) the two alternate, so the order is controlled.

Prompts are left-padded to ``--prompt`` tokens with real lengths uniform in
``[prompt / 4, prompt]``; responses right-padded to ``--response`` with lengths uniform in
``[--min-response, response]``. Tokens/s counts real tokens only.

    python -m repro.bench.rmpad --shape qwen3-0.6b --out results/rmpad/table.tsv   # 1 GPU
    python -m repro.bench.rmpad --shape tiny --prompt 32 --response 32 --min-response 4 --steps 1  # CPU smoke run

``--host-ops`` counts, in one more update per case, the operators the host dispatches (by issuer) and,
on CUDA, the device syncs it waits on (the work of a launch-bound step; the same on any machine for one model depth and
batch split). ``--profile DIR`` adds one update per case under torch.profiler: ``DIR/<case>_<round>/``
gets its trace and ``phases.md``, the time per phase beside each phase's ideal
(:mod:`repro.bench.profile_phases`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from repro.bench import gc_pauses
from repro.bench.gc_pauses import GcPauses
from repro.bench.host_ops import host_ops
from repro.bench.shapes import make_model_dir, model_config
from repro.bench.workdir import open_workdir
from repro.bench.workers import _sync, add_case_process_args
from repro.collectives.launch.launcher import free_port
from repro.config.fields import COMPILE_SCOPES, FLASH_ATTENTION
from repro.devices import on_cpu

CASES = ("padded_full", "padded", "padded_dynbsz", "rmpad", "rmpad_sdpa", "rmpad_lora", "rmpad_compiled")
COLUMNS = ("round", "case", "varlen", "step_s", "real_tokens_per_s", "mfu", "max_allocated_gb", "max_reserved_gb",
           "vs_padded_full", "host_ops", "host_syncs")


def _run_config(model_dir: str, case: str, args: argparse.Namespace):
    from repro.config import DeepSpeedConfig, RunConfig

    cfg = RunConfig()
    cfg.trainer.n_gpus_per_node, cfg.trainer.nnodes = 1, 1
    samples = args.micro * args.gas
    cfg.data.train_batch_size = samples
    cfg.data.max_prompt_length, cfg.data.max_response_length = args.prompt, args.response
    arr = cfg.actor_rollout_ref
    arr.rollout.n = 1
    arr.model.path = model_dir
    # on by default so that figures stay comparable with the earlier sessions' tables; off trades memory
    # (activations of every layer) for the recomputed forward, a quarter of the update's FLOPs
    arr.model.enable_gradient_checkpointing = {"on": True, "off": False, "auto": "auto"}[args.checkpointing]
    actor = arr.actor
    actor.ppo_mini_batch_size = samples
    actor.optim.lr = 1e-6
    if case.startswith("rmpad"):
        arr.model.use_remove_padding = True
    if case.startswith("rmpad") or case == "padded_dynbsz":
        actor.use_dynamic_bsz = True
        actor.ppo_micro_batch_size_per_gpu = None
        actor.ppo_max_token_len_per_gpu = args.budget or args.micro * (args.prompt + args.response)
    else:
        actor.ppo_micro_batch_size_per_gpu = args.micro
    # the log-prob pass (--infer) splits the batch as the update does: the same budget, or the same micro-batch
    arr.rollout.log_prob_use_dynamic_bsz = bool(actor.use_dynamic_bsz)
    if actor.use_dynamic_bsz:
        arr.rollout.log_prob_max_token_len_per_gpu = actor.ppo_max_token_len_per_gpu
    else:
        arr.rollout.log_prob_micro_batch_size_per_gpu = args.micro
    if case.endswith("lora"):
        arr.model.lora_rank, arr.model.lora_alpha = 8, 16
    arr.model.flash_attention = args.flash_attention
    if case.endswith("compiled"):
        arr.model.compile_layers = args.compile_backend  # the worker compiles them (repro.workers.layer_compile)
        arr.model.compile_scope = args.compile_scope
    # torch's AdamW by default: DeepSpeed's FusedAdam (the CUDA default of repro's config) is JIT-built on first use
    actor.deepspeed = DeepSpeedConfig(zero_stage=args.zero_stage, torch_adam=args.adam == "torch",
                                      fused_overflow_check=args.overflow_check == "fused")
    return cfg


def make_batch(args: argparse.Namespace, vocab: int, min_prompt: int | None = None):
    """Left-padded prompts and right-padded responses with uniform real lengths (seed 0): prompts of ``min_prompt``
    (default a quarter of ``args.prompt``) to ``args.prompt`` tokens, responses of ``args.min_response`` to
    ``args.response``."""
    import torch

    gen = torch.Generator().manual_seed(0)
    b, p, r = args.micro * args.gas, args.prompt, args.response
    p_lens = torch.randint(max(1, p // 4) if min_prompt is None else min_prompt, p + 1, (b,), generator=gen)
    r_lens = torch.randint(args.min_response, r + 1, (b,), generator=gen)
    prompt_mask = torch.arange(p)[None] >= (p - p_lens)[:, None]
    response_mask = torch.arange(r)[None] < r_lens[:, None]
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1).long()
    input_ids = torch.randint(3, vocab, (b, p + r), generator=gen) * attention_mask
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        "responses": input_ids[:, p:].clone(),
        "response_mask": response_mask.long(),
        "old_log_probs": -torch.rand(b, r, generator=gen) * 5 * response_mask,
        "advantages": torch.randn(b, r, generator=gen) * response_mask,
    }


def _child(args: argparse.Namespace) -> None:
    import torch

    from repro.cluster.process_group import init_distributed
    from repro.rl.mfu import device_name, mfu
    from repro.workers import activation_checkpointing, logprob, rms_norm, varlen
    from repro.workers.actor import ActorWorker
    from repro.workers.layer_compile import captured_graphs, compiled_layers, graph_breaks
    from repro.workers.overflow_check import overflow_check

    init_distributed()
    if args.case == "padded_full":
        # one chunk of the whole micro-batch: the full-vocabulary fp32 computation
        logprob.token_log_probs.__kwdefaults__["chunk_elements"] = 1 << 62
        logprob.MODE = "eager"
    else:
        logprob.MODE = args.logprob
    varlen.ENABLED = args.case != "rmpad_sdpa"
    rms_norm.MODE = args.norms
    cfg = _run_config(args.model_dir, args.case, args)
    batch = make_batch(args, model_config(args.shape).vocab_size)
    worker = ActorWorker(cfg)
    run_before = worker.engine.micro_batches_run
    times, pauses = _timed(args, lambda: worker.update_policy(batch), reset_peak=True)
    # what an update's host work scales with: the engine's own count of the backward passes it ran, per update
    micro_batches = (worker.engine.micro_batches_run - run_before) / len(times)
    # the old-log-prob pass as verl's trainer runs it (entropy on, no gradient), timed the same way
    infer, infer_pauses = ([], []) if not args.infer else _timed(
        args, lambda: worker.compute_log_prob(batch, calculate_entropy=True))
    host = host_ops(lambda: worker.update_policy(batch)) if args.host_ops else {}
    if args.profile:
        _profile(args, worker, batch)
    step_s = statistics.median(times[args.warmup:])
    on_gpu = not on_cpu()
    lengths = batch["attention_mask"].sum(1).tolist()
    device, config = device_name(worker.engine.device), model_config(args.shape)
    infer_s = statistics.median(infer[args.warmup:]) if infer else None
    report = worker.engine.report()
    row = {
        "case": args.case, "varlen": int(worker.varlen), "step_s": step_s, "micro_batches": micro_batches,
        # read back from DeepSpeed: the stage decides whether gradients are reduced after every micro-batch (2)
        "zero_stage": report["stage"],
        # the trainer's own figures (repro.rl.mfu, verl's formula): perf/mfu/actor_infer for the log-prob pass
        **({"infer_s": infer_s, "infer_each_s": infer[args.warmup:],
            "infer_mfu": mfu(config, lengths, infer_s, device, forward_only=True)} if infer else {}),
        # every timed update: A/B runs of one tree differed by up to 25% between processes (results/actor_update,
        # session 15), so a reader must see whether an update's spread or a process's placement made a median
        "update_s": times[args.warmup:],
        # the host's garbage-collection pauses in each timed update (and pass): repro.bench.gc_pauses; --gc's policy
        "gc": args.gc, **_gc_row("", pauses), **_gc_row("infer_", infer_pauses),
        "real_tokens_per_s": float(batch["attention_mask"].sum()) / step_s,
        # perf/mfu/actor over the whole batch and the median update
        "mfu": mfu(config, lengths, step_s, device),
        "max_allocated_gb": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else float("nan"),
        "max_reserved_gb": torch.cuda.max_memory_reserved() / 2**30 if on_gpu else float("nan"),
        # read back from the model the engine trains, not the flag the bench was given
        "checkpointing": activation_checkpointing.in_use(worker.engine.module),
        # --checkpointing auto: what the first update measured and chose (repro.workers.activation_checkpointing)
        "checkpointing_auto": report["checkpointing_auto"],
        # the basic optimizer inside ZeRO's wrapper, read back from the DeepSpeed engine
        "optimizer": type(getattr(worker.engine.engine.optimizer, "optimizer", worker.engine.engine.optimizer)).__name__,
        # read back: the layers the engine's model runs compiled, and the graphs dynamo captured (the layers' and, on
        # CUDA, the log-prob chunks')
        "compiled_layers": compiled_layers(worker.engine.module),
        "overflow_check": overflow_check(worker.engine.engine.optimizer),
        # read back from torch's flash attention registry: the kernels the varlen op dispatched to
        "flash_attention": varlen.current_impl(),
        # the host's intra-op threads (OMP_NUM_THREADS, read back): the trainer's ranks run with one
        "intra_op_threads": torch.get_num_threads(),
        "compiled_graphs": captured_graphs(),
        "graph_breaks": graph_breaks(),  # where a compiled layer's trace stopped (a host round-trip each)
        **host,
    }
    Path(args.result).write_text(json.dumps(row))


def _timed(args: argparse.Namespace, call, reset_peak: bool = False) -> tuple[list[float], list[GcPauses]]:
    """Seconds of each of ``warmup + steps`` calls, the device drained before and after each (peak memory counted
    from the first timed call when ``reset_peak``; ``--gc``'s policy set after the warm-up), and the garbage
    collections in each timed call."""
    import torch

    times, pauses = [], []
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            gc_pauses.apply(args.gc)
            if reset_peak and torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
        _sync()
        with GcPauses() as collections:
            start = time.perf_counter()
            call()
            _sync()
            times.append(time.perf_counter() - start)
        if i >= args.warmup:
            pauses.append(collections)
    return times, pauses


def _gc_row(prefix: str, pauses: list[GcPauses]) -> dict:
    """Each timed call's collections: seconds (all generations) and full (generation-2) collections."""
    return {f"{prefix}gc_s": [p.total_seconds() for p in pauses], f"{prefix}gc_full": [p.count[2] for p in pauses]}


def _profile(args: argparse.Namespace, worker, batch: dict) -> None:
    """One more update under the profiler, after the timed ones, and with ``--infer`` one more log-prob pass
    (``<case>_<round>_infer``): :func:`repro.bench.profile_pass.profile_pass`."""
    from repro.bench.profile_pass import batch_counts, profile_pass

    passes = [("", lambda: worker.update_policy(batch), False)]
    if args.infer:
        passes.append(("_infer", lambda: worker.compute_log_prob(batch, calculate_entropy=True), True))
    counts = batch_counts(model_config(args.shape), batch)
    for suffix, run, forward_only in passes:
        text = profile_pass(run, Path(args.profile) / (Path(args.result).stem + suffix), f"{args.case}{suffix}",
                            worker.engine.module, args.warmup + args.steps + 1, worker.engine.device, counts,
                            forward_only)
        print(text, flush=True)


def _launch(args: argparse.Namespace, case: str, model_dir: Path, run_dir: Path, rnd: int) -> dict:
    result, log = run_dir / f"{case}_{rnd}.json", run_dir / f"{case}_{rnd}.log"
    cmd = [sys.executable, "-m", "repro.bench.rmpad", "--child", "--case", case, "--model-dir", str(model_dir),
           "--result", str(result), "--shape", args.shape, "--prompt", str(args.prompt),
           "--response", str(args.response), "--min-response", str(args.min_response), "--micro", str(args.micro),
           "--gas", str(args.gas), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--zero-stage", str(args.zero_stage), "--budget", str(args.budget), "--checkpointing", args.checkpointing,
           "--logprob", args.logprob, "--adam", args.adam, "--overflow-check", args.overflow_check, "--gc", args.gc]
    if args.infer:
        cmd.append("--infer")
    if args.host_ops:
        cmd.append("--host-ops")
    cmd += ["--norms", args.norms, "--compile-backend", args.compile_backend, "--compile-scope", args.compile_scope,
            "--flash-attention", args.flash_attention]
    if args.profile:
        cmd += ["--profile", args.profile]
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    with open(log, "w") as out:
        code = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
    if code != 0 or not result.is_file():
        raise RuntimeError(f"{case} failed (exit code {code}); log {log}:\n{log.read_text()[-4000:]}")
    return {"round": rnd, **json.loads(result.read_text())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen3-0.6b",
                        help="qwen3-0.6b (GPU), tiny (CPU smoke run) or qwen3-0.6b-narrow (the 0.6B's layers and "
                             "vocabulary at a width a CPU runs: its --host-ops are the 0.6B's)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {list(CASES)}")
    parser.add_argument("--prompt", type=int, default=512, help="padded prompt length")
    parser.add_argument("--response", type=int, default=512, help="padded response length")
    parser.add_argument("--min-response", type=int, default=64)
    parser.add_argument("--micro", type=int, default=4, help="samples per padded micro-batch")
    parser.add_argument("--gas", type=int, default=4, help="padded micro-batches per update")
    parser.add_argument("--zero-stage", type=int, default=2)
    parser.add_argument("--budget", type=int, default=0,
                        help="token budget of the dynamic cases (default micro x (prompt + response): the padded memory)")
    parser.add_argument("--checkpointing", choices=("on", "off", "auto"), default="on",
                        help="activation checkpointing of the decoder layers (enable_gradient_checkpointing; auto: "
                             "decided from the free memory at the first update)")
    parser.add_argument("--logprob", choices=("auto", "compiled", "eager"), default="auto",
                        help="log-prob chunks (repro.workers.logprob.MODE): auto = compiled on CUDA in half precision")
    parser.add_argument("--adam", choices=("torch", "fused"), default="torch",
                        help="torch's AdamW, or DeepSpeed's FusedAdam (CUDA; JIT-built once per machine)")
    parser.add_argument("--overflow-check", choices=("fused", "per_tensor"), default="fused",
                        help="ZeRO-1/2's inf/NaN test of the gradients before a step: repro's one reduction, or "
                             "DeepSpeed's loop over the tensors (fused_overflow_check=false)")
    parser.add_argument("--infer", action="store_true",
                        help="also time the old-log-prob pass (compute_log_prob with entropy) and print its MFU")
    parser.add_argument("--profile", default="",
                        help="folder: one more update per case (and log-prob pass with --infer) under "
                             "torch.profiler, and its phases.md")
    parser.add_argument("--host-ops", action="store_true",
                        help="count the operators and device syncs the host issues in one more update per case")
    parser.add_argument("--norms", choices=("auto", "fused", "eager"), default="auto",
                        help="RMSNorm form (repro.workers.rms_norm): auto = fused on CUDA in half precision")
    parser.add_argument("--compile-backend", choices=("inductor", "aot_eager"), default="inductor",
                        help="torch.compile backend of the rmpad_compiled case (aot_eager: traced, no code generated)")
    parser.add_argument("--compile-scope", choices=COMPILE_SCOPES, default="layer",
                        help="model.compile_scope of the rmpad_compiled case: each decoder layer, or the whole stack")
    parser.add_argument("--flash-attention", choices=FLASH_ATTENTION, default="torch",
                        help="model.flash_attention: torch's FlashAttention-2, or FlashAttention-4 (the gpu extra)")
    parser.add_argument("--gc", choices=gc_pauses.POLICIES, default="default",
                        help="Python's garbage collection in the timed calls (repro.bench.gc_pauses): Python's own, "
                             "or gc.freeze() after the warm-up")
    parser.add_argument("--steps", type=int, default=3, help="measured updates per case (median)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="cases alternated this many times")
    parser.add_argument("--timeout", type=float, default=600.0)
    add_case_process_args(parser)
    args = parser.parse_args(argv)
    if args.child:
        from repro.cluster.process_group import exit_rank_process

        _child(args)
        exit_rank_process(0)
    cases = [c for c in args.cases.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad:
        print(f"error: --cases {bad[0]!r} is not valid; choose from {list(CASES)}", file=sys.stderr)
        return 2
    if "rmpad_compiled" in cases:
        from repro.config.rules import compile_refusal

        why = compile_refusal(args.zero_stage)
        if why:
            print(f"error: --cases rmpad_compiled: compiled decoder layers: {why}", file=sys.stderr)
            return 2
    workdir, run_dir = open_workdir(args.workdir, "repro_rmpad_")
    model_dir = make_model_dir(args.shape, workdir / f"model_{args.shape}")
    rows = []
    for rnd in range(args.rounds):
        for case in cases:
            rows.append(_launch(args, case, model_dir, run_dir, rnd))
            compiled = (f", {rows[-1]['compiled_graphs']} graphs compiled, {rows[-1]['graph_breaks']} graph breaks"
                        if rows[-1].get("compiled_graphs") else "")
            upd = rows[-1]["update_s"]
            gcs = rows[-1]["gc_s"]
            print(f"# round {rnd} {case}: {rows[-1]['step_s']:.3f} s/update (median of {len(upd)}: {min(upd):.3f}-{max(upd):.3f})"
                  f", MFU {rows[-1]['mfu']:.1%}, ZeRO-{rows[-1]['zero_stage']}, {rows[-1]['micro_batches']:g} micro-batch"
                  f"{'' if rows[-1]['micro_batches'] == 1 else 'es'} an update, {rows[-1]['optimizer']}{compiled}, flash {rows[-1]['flash_attention']}, "
                  f"GC ({rows[-1]['gc']}) {max(gcs):.3f} s at most in an update, {sum(rows[-1]['gc_full'])} full",
                  file=sys.stderr, flush=True)
            if "infer_s" in rows[-1]:
                inf = rows[-1]["infer_each_s"]
                print(f"# round {rnd} {case}: log-prob pass {rows[-1]['infer_s']:.3f} s (median of {len(inf)}: "
                      f"{min(inf):.3f}-{max(inf):.3f}), MFU {rows[-1]['infer_mfu']:.1%}", file=sys.stderr, flush=True)
            if "host_ops_by" in rows[-1]:
                print(f"# round {rnd} {case}: host ops by issuer {rows[-1]['host_ops_by']}", file=sys.stderr, flush=True)
                for frame, count in rows[-1]["host_ops_top"].items():
                    print(f"#   {count:6d}  {frame}", file=sys.stderr, flush=True)
                for site, count in rows[-1]["host_sync_sites"].items():
                    print(f"#   {count:6d}  device sync at {site}", file=sys.stderr, flush=True)
    lines = ["\t".join(COLUMNS)]
    for r in rows:
        base = next((b for b in rows if b["round"] == r["round"] and b["case"] == "padded_full"), None)
        ratio = f"{r['real_tokens_per_s'] / base['real_tokens_per_s']:.3f}" if base else ""
        lines.append("\t".join([str(r["round"]), r["case"], str(r["varlen"]), f"{r['step_s']:.4f}", f"{r['real_tokens_per_s']:.1f}",
                                f"{r['mfu']:.4f}",
                                f"{r['max_allocated_gb']:.2f}", f"{r['max_reserved_gb']:.2f}", ratio,
                                str(r.get("host_ops", "")), str(r.get("host_syncs", ""))]))
    table = "\n".join(lines)
    print(table, flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
