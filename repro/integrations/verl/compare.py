"""verl's FSDP2 engine and repro's DeepSpeed engine on the same batches, one GPU, side by side.

    python -m repro.integrations.verl.compare --shape qwen3-0.6b --steps 10 --out results/verl_engine/gpu

Each case runs in a fresh process (peak memory would leak from one case into the next) that
builds its engine the way verl's TrainingWorker does (``EngineRegistry.new``) and runs verl's RL
update path each step: ``eval_mode`` + ``infer_batch`` for the old log-probs, then ``train_mode`` +
``train_batch`` with verl's own ``ppo_loss``, then ``lr_scheduler_step``. Every case sees the same
model (random init, saved once) and the same batches (prompts 64..256 tokens left-padded,
responses 64..512, GRPO-like per-sequence advantages). bf16 compute with fp32 master weights and
AdamW on both sides, gradient checkpointing on, the padded forward with sdpa (the GPU image has
no flash-attn). The ``-rmpad`` cases set verl's ``use_remove_padding``: repro's engine runs packed rows, on a GPU
through repro's varlen path (torch's FlashAttention-2, or FlashAttention-4 with ``deepspeed.flash_attention=fa4``,
the ``gpu`` extra; ``-compiled`` adds ``deepspeed.compile_layers=inductor``), still held to the padded FSDP2 run;
each case's JSON keeps what its engine reported (its setup line, the kernels, compiled layers, masked forwards),
and a packed case whose engine did not attend that way fails.

The check is verl's own bar for a new engine (``tests/special_e2e/sft/test_sft_engine_all.sh``):
step-1 loss within atol/rtol 1e-2 and grad norm within atol 1e-4 / rtol 3e-2 of the FSDP run.
The old log-probs come from each engine's own forward, so the PPO ratio starts at 1 and the
step's loss is minus the mean advantage whatever the model: the loss column checks the plumbing
(token counts, normalisation), the grad norm and the mean response log-prob (same bar as the
loss) check the model's arithmetic.
Later steps are reported as drift, not checked: bf16 rounding differs between the engines (FSDP2
casts per module, DeepSpeed keeps a bf16 weight copy) and compounds through Adam.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from repro.collectives.launch.launcher import free_port

CASES = {
    "fsdp2": {"backend": "fsdp2"},
    "ds-zero2": {"backend": "deepspeed", "zero_stage": 2},
    "ds-zero3-leaf": {"backend": "deepspeed", "zero_stage": 3},
    # verl's use_remove_padding: packed rows, attended through repro's varlen path on a GPU (the engine must say so)
    "ds-zero2-rmpad": {"backend": "deepspeed", "zero_stage": 2, "remove_padding": True},
    "ds-zero2-rmpad-fa4": {"backend": "deepspeed", "zero_stage": 2, "remove_padding": True, "flash_attention": "fa4"},
    "ds-zero2-rmpad-fa4-compiled": {"backend": "deepspeed", "zero_stage": 2, "remove_padding": True,
                                    "flash_attention": "fa4", "compile_layers": "inductor"},
}
DEFAULT_CASES = ("fsdp2", "ds-zero2", "ds-zero3-leaf", "ds-zero2-rmpad")
"""Any machine's cases; the FA4 ones need a Hopper GPU and the ``gpu`` extra."""
BASELINE = "fsdp2"
LR, MICRO, SAMPLES = 1e-6, 4, 16
PROMPT, RESPONSE = (64, 256), (64, 512)
LOSS_TOL, NORM_ATOL, NORM_RTOL = 1e-2, 1e-4, 3e-2  # verl's bar (see the module docstring)


def model_dir(shape: str, out: Path) -> Path:
    import torch

    from repro.data.tiny_model import PolicyShape, build_model, qwen3_0p6b_config, save_model, tiny_config

    folder = out / f"model-{shape}"
    if (folder / "config.json").is_file():
        return folder
    config = qwen3_0p6b_config() if shape == "qwen3-0.6b" else tiny_config(
        vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        shape=PolicyShape(hidden_size=64, num_hidden_layers=2, intermediate_size=128, max_position_embeddings=1024))
    save_model(build_model(config, seed=0, dtype=torch.float32), folder)
    return folder


def step_batch(step: int, vocab: int, scale: int) -> dict[str, Any]:
    """Step ``step``'s padded batch: left-padded prompts, right-padded responses, per-sample advantages."""
    import torch

    from repro.batching.batch import padded_batch

    gen = torch.Generator().manual_seed(1000 + step)
    p_max, r_max = PROMPT[1] // scale, RESPONSE[1] // scale
    p_lens = torch.randint(PROMPT[0] // scale, p_max + 1, (SAMPLES,), generator=gen)
    r_lens = torch.randint(RESPONSE[0] // scale, r_max + 1, (SAMPLES,), generator=gen)
    prompt_mask = (torch.arange(p_max)[None] >= (p_max - p_lens)[:, None]).long()
    prompt = torch.randint(3, vocab, (SAMPLES, p_max), generator=gen) * prompt_mask
    response_mask = (torch.arange(r_max)[None] < r_lens[:, None]).long()
    responses = torch.randint(3, vocab, (SAMPLES, r_max), generator=gen) * response_mask
    batch = padded_batch(prompt, prompt_mask, responses, response_mask)
    batch["advantages"] = torch.randn(SAMPLES, 1, generator=gen).expand(-1, r_max) * response_mask
    return batch


def to_tensordict(batch: dict[str, Any], prompt_len: int, remove_padding: bool = False) -> Any:
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    td = TensorDict({**batch, "prompts": batch["input_ids"][:, :prompt_len]}, batch_size=[SAMPLES])
    td = left_right_2_no_padding(td)
    tu.assign_non_tensor(td, use_dynamic_bsz=False, max_token_len_per_gpu=None, micro_batch_size_per_gpu=MICRO,
                         use_remove_padding=remove_padding, temperature=1.0, global_batch_size=SAMPLES,
                         calculate_entropy=False)
    return td


def build(case: str, path: Path) -> tuple[Any, Any]:
    """(engine, loss function) as verl's TrainingWorker builds them."""
    import torch
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.utils.losses import ppo_loss

    from repro.integrations.verl import register
    from repro.integrations.verl.config import (
        DeepSpeedActorConfig,
        DeepSpeedEngineConfig,
        DeepSpeedOptimizerConfig,
    )
    from repro.integrations.verl.platform import use_cpu_platform_if_cpu

    register()
    spec = CASES[case]
    cuda = torch.cuda.is_available()
    # On CPU (the smoke run) everything is fp32; verl's platform helper comes from the plugin.
    use_cpu_platform_if_cpu()
    rmpad = bool(spec.get("remove_padding"))
    model = HFModelConfig(path=str(path), load_tokenizer=False, use_remove_padding=rmpad,
                          enable_gradient_checkpointing=True, override_config={"attn_implementation": "sdpa"})
    ds = DeepSpeedEngineConfig(zero_stage=spec.get("zero_stage", 2), model_dtype="bfloat16" if cuda else "float32", seed=7,
                               micro_batch_size_per_gpu=MICRO, use_remove_padding=rmpad,
                               flash_attention=spec.get("flash_attention", "torch"),
                               compile_layers=spec.get("compile_layers", "off"))
    loss_cfg = DeepSpeedActorConfig(
        rollout_n=1, ppo_mini_batch_size=SAMPLES, ppo_micro_batch_size_per_gpu=MICRO, loss_agg_mode="token-mean",
        clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, use_kl_loss=False, shuffle=False,
        optim=DeepSpeedOptimizerConfig(lr=LR, weight_decay=0.01, clip_grad=1.0), deepspeed=ds)
    if spec["backend"] == "fsdp2":
        precision = {} if cuda else {"mixed_precision": {"param_dtype": "fp32", "reduce_dtype": "fp32",
                                                         "buffer_dtype": "fp32"}}
        engine_cfg = FSDPEngineConfig(strategy="fsdp2", seed=7, use_torch_compile=False, micro_batch_size_per_gpu=MICRO,
                                      model_dtype="fp32", **precision)
        optim = FSDPOptimizerConfig(lr=LR, weight_decay=0.01, clip_grad=1.0)
    else:
        engine_cfg, optim = ds, loss_cfg.optim
    kwargs = dict(model_config=model, engine_config=engine_cfg, optimizer_config=optim, checkpoint_config=CheckpointConfig())
    if spec["backend"] == "fsdp2" and not cuda:
        engine = FSDPEngineWithLMHead(**kwargs)  # verl registers FSDP for cuda and npu only
    else:
        engine = EngineRegistry.new(model_type="language_model", backend=spec["backend"], **kwargs)
    engine.initialize()
    return engine, functools.partial(ppo_loss, loss_cfg)


def run_case(case: str, path: Path, steps: int, scale: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from verl.workers.utils.padding import no_padding_2_padding

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if torch.cuda.is_available():
        torch.cuda.set_device(0)
    engine, loss_fn = build(case, path)
    rmpad = bool(CASES[case].get("remove_padding"))
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    rows = []
    for step in range(steps):
        batch = step_batch(step, vocab, scale)
        prompt_len = PROMPT[1] // scale
        sync()
        t0 = time.perf_counter()
        with engine.eval_mode():
            out = engine.infer_batch(to_tensordict(batch, prompt_len, rmpad))
        td = to_tensordict(batch, prompt_len, rmpad)
        old = no_padding_2_padding(out["model_output"]["log_probs"], td).float().cpu()
        batch["old_log_probs"] = old * batch["response_mask"]
        sync()
        t1 = time.perf_counter()
        with engine.train_mode():
            result = engine.train_batch(to_tensordict(batch, prompt_len, rmpad), loss_function=loss_fn)
        engine.lr_scheduler_step()
        sync()
        t2 = time.perf_counter()
        tokens = int(batch["attention_mask"].sum())
        logprob = float(batch["old_log_probs"].sum() / batch["response_mask"].sum())
        rows.append({"step": step + 1, "loss": float(sum(result["loss"])), "logprob": logprob,
                     "grad_norm": float(result["metrics"]["grad_norm"]), "infer_s": t1 - t0, "update_s": t2 - t1,
                     "update_tokens_per_s": tokens / (t2 - t1)})
        print(f"[{case}] step {step + 1}: {rows[-1]}", flush=True)
    mem = {}
    if torch.cuda.is_available():
        mem = {"max_allocated_gb": torch.cuda.max_memory_allocated() / 2**30,
               "max_reserved_gb": torch.cuda.max_memory_reserved() / 2**30,
               "device": torch.cuda.get_device_name(0)}
    engaged = engaged_attention(engine)
    dist.destroy_process_group()
    return {"case": case, "steps": rows, "cuda": torch.cuda.is_available(), **engaged, **mem}


def engaged_attention(engine: Any) -> dict[str, Any]:
    """How the built engine attends, as it reports it (repro's engine; verl's FSDP2 says nothing of its own)."""
    if not hasattr(engine, "role"):
        return {}
    rep = engine.role.report()
    return {"engine_line": engine.setup_line(), "varlen": engine.varlen, "flash_attention": rep["flash_attention"],
            "compiled_layers": rep["compiled_layers"], "masked_forwards": rep["fed"]["masked"],
            "forwards": rep["fed"]["forwards"]}


def engagement_failures(case: str, res: dict[str, Any]) -> list[str]:
    """A case is only what its engine reports: a packed case's forwards came without a mask (a padded case's with
    one), on a GPU it attends through the varlen path on the kernels it asked for, and a compiled case has compiled
    layers. On CPU (fp32) packed rows attend through transformers' block-causal mask (``repro.workers.varlen.supported``).
    verl's FSDP2 reports none of this: its case is not checked here."""
    from repro.workers.varlen import FLASH_IMPLS

    spec, out = CASES[case], []
    if "forwards" not in res:
        return out
    packed = bool(spec.get("remove_padding"))
    if res["masked_forwards"] != (0 if packed else res["forwards"]):
        out.append(f"{case}: {res['masked_forwards']} of {res['forwards']} forwards with a mask, "
                   f"{'packed' if packed else 'padded'} rows asked for")
    if packed and res.get("cuda"):
        if not res.get("varlen"):
            out.append(f"{case}: packed rows not attended through the varlen path ({res.get('engine_line')})")
        want = FLASH_IMPLS[spec.get("flash_attention", "torch")] or "torch"  # as current_impl names them
        if res.get("flash_attention") != want:
            out.append(f"{case}: flash kernels {res.get('flash_attention')!r}, asked for {want!r}")
    if spec.get("compile_layers", "off") != "off" and not res.get("compiled_layers"):
        out.append(f"{case}: no compiled layer ({res.get('engine_line')})")
    return out


def compare(results: dict[str, dict]) -> tuple[list[str], list[str]]:
    """(markdown table lines, failures of verl's step-1 bar against the FSDP2 run)."""
    base = results[BASELINE]["steps"]
    lines = ["| case | step | loss | mean log-prob | grad norm | loss vs fsdp2 | log-prob vs fsdp2 | grad norm vs fsdp2 "
             "| update tok/s | infer s |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    failures = []
    for case, res in results.items():
        for row, ref in zip(res["steps"], base, strict=True):
            dl, dn = row["loss"] - ref["loss"], row["grad_norm"] - ref["grad_norm"]
            dp = row.get("logprob", 0.0) - ref.get("logprob", 0.0)
            lines.append(f"| {case} | {row['step']} | {row['loss']:.6f} | {row.get('logprob', float('nan')):.5f} | "
                         f"{row['grad_norm']:.6f} | {dl:+.2e} | {dp:+.2e} | {dn / ref['grad_norm']:+.2%} | "
                         f"{row['update_tokens_per_s']:.0f} | {row['infer_s']:.3f} |")
        first, ref = res["steps"][0], base[0]
        for key in ("loss", "logprob"):
            if key in ref and abs(first[key] - ref[key]) > LOSS_TOL + LOSS_TOL * abs(ref[key]):
                failures.append(f"{case}: step-1 {key} {first[key]} vs {ref[key]}")
        if abs(first["grad_norm"] - ref["grad_norm"]) > NORM_ATOL + NORM_RTOL * abs(ref["grad_norm"]):
            failures.append(f"{case}: step-1 grad norm {first['grad_norm']} vs {ref['grad_norm']}")
        failures += engagement_failures(case, res)
    return lines, failures



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m repro.integrations.verl.compare", description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="qwen3-0.6b", choices=["qwen3-0.6b", "tiny"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"from {list(CASES)}")
    parser.add_argument("--out", type=Path, default=Path("results/verl_engine/gpu"))
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    scale = 1 if args.shape == "qwen3-0.6b" else 16  # the tiny shape: the same batch layout, 16x shorter
    if args.case:
        result = run_case(args.case, model_dir(args.shape, args.out), args.steps, scale)
        (args.out / f"{args.case}.json").write_text(json.dumps(result, indent=1))
        return 0
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown or BASELINE not in cases:
        print(f"--cases: {unknown or 'missing ' + BASELINE} is not valid; choose from {list(CASES)} "
              f"({BASELINE} included: the others are compared with it)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir(args.shape, args.out)
    results = {}
    for case in cases:
        env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(free_port()))
        cmd = [sys.executable, "-m", "repro.integrations.verl.compare", "--case", case, "--shape", args.shape,
               "--steps", str(args.steps), "--out", str(args.out)]
        with open(args.out / f"{case}.log", "w") as log:
            rc = subprocess.call(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        if rc:
            print(f"{case} failed (exit {rc}); log {args.out / f'{case}.log'}", file=sys.stderr)
            return 1
        results[case] = json.loads((args.out / f"{case}.json").read_text())
    lines, failures = compare(results)
    mem = [f"| {c} | {r.get('max_allocated_gb', 0):.1f} | {r.get('max_reserved_gb', 0):.1f} |" for c, r in results.items()]
    text = "\n".join(lines + ["", "| case | max allocated GB | max reserved GB |", "| --- | --- | --- |", *mem])
    (args.out / "table.md").write_text(text + "\n")
    print(text)
    for f in failures:
        print("FAIL (verl's step-1 bar):", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
