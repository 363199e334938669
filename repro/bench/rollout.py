"""``python -m repro.bench.rollout gen|grpo|all``: the vLLM rollout against HF ``generate``, one GPU.

- ``gen``: new tokens/s of each rollout's own ``generate`` (repro's adapters, weights pushed in
  as in training, sampling at temperature 1) on the Qwen3-0.6B shape (random init, the char
  tokenizer's EOS), at each ``--batches`` size, ``--prompt-len`` random prompt ids and up to
  ``--new-tokens`` new tokens; counted tokens are the response-mask sum. vLLM's time includes its
  wake-up and sleep around the call, as in a training step. ``plain`` is the library the hf
  rollout wraps, called as a user would: ``from_pretrained`` + ``generate`` with the same
  prompts, sampling and stop token, so ``hf / plain`` is what repro's adapter costs.
  ``--profile N`` adds torch.profiler's top CPU-side ops of an ``N``-token generate per rollout.
- ``grpo``: s/step of a short GRPO job on the same shape (the real trainer: Ray, DeepSpeed ZeRO-2,
  GSM8K prompts from ``fixtures/gsm8k``), one job process per rollout, tail means of the step
  time split from ``metrics.tsv`` (torch AdamW in both, so no FusedAdam JIT build skews the first job).

Every figure comes from one command, HF and vLLM measured back to back, and is printed as one
JSON line; the last line holds the vLLM/HF ratios. ``--out`` keeps ``rollout_bench.json`` and
the jobs' folders.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNER = "import sys\nfrom repro.config.loader import load_config\nfrom repro.trainer import run\nrun(load_config(sys.argv[1:]))\n"
SPLIT_KEYS = ("timing_s/step", "timing_s/gen", "timing_s/update_weights", "timing_s/old_log_prob",
              "timing_s/update_actor")


def make_policy_dir(out: Path) -> Path:
    """Random-init Qwen3-0.6B shape with the char tokenizer's special ids, saved in bf16 (once)."""
    import torch

    from repro.data.tiny_model import build_model, qwen3_0p6b_config, save_model
    from repro.data.tokenizer import build_tokenizer, save_tokenizer

    model_dir = out / "model"
    if (model_dir / "config.json").is_file():
        return model_dir
    tok = build_tokenizer()
    config = qwen3_0p6b_config()
    config.pad_token_id, config.bos_token_id, config.eos_token_id = tok.pad_token_id, tok.bos_token_id, tok.eos_token_id
    save_model(build_model(config, seed=0, dtype=torch.bfloat16), model_dir)
    save_tokenizer(model_dir)
    return model_dir


def _gen_config(model_dir: Path, args: argparse.Namespace, name: str):
    from repro.config import RunConfig

    cfg = RunConfig()
    cfg.actor_rollout_ref.model.path = str(model_dir)
    cfg.data.max_prompt_length, cfg.data.max_response_length = args.prompt_len, args.new_tokens
    ro = cfg.actor_rollout_ref.rollout
    ro.name, ro.temperature, ro.load_format = name, 1.0, "dummy"
    ro.gpu_memory_utilization, ro.enforce_eager, ro.max_num_seqs = args.util, args.eager, max(args.batches)
    return cfg


class PlainGenerate:
    """Plain ``transformers``: ``from_pretrained`` on the GPU and ``generate``, sampling as the rollouts do."""

    def __init__(self, model_dir: Path, args: argparse.Namespace) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to("cuda").eval()
        self.pad_id, self.eos_id = self.model.config.pad_token_id, self.model.config.eos_token_id
        self.new_tokens = args.new_tokens

    def load_weights(self, named_tensors: object) -> None:
        """The weights came from disk: the same random init as the source the rollouts copy."""

    def generate(self, prompts: list[list[int]], n: int = 1, *, seed: int = 0,
                 response_length: int | None = None) -> dict:
        import torch

        from repro.workers import rollout_layout as layout

        ids, mask = layout.left_pad(prompts, self.pad_id, None)
        torch.manual_seed(seed)
        with torch.no_grad():
            out = self.model.generate(input_ids=ids.cuda(), attention_mask=mask.cuda(), do_sample=True,
                                      temperature=1.0, top_p=1.0, top_k=0,
                                      max_new_tokens=response_length or self.new_tokens,
                                      eos_token_id=self.eos_id, pad_token_id=self.pad_id)
        return {"response_mask": layout.response_mask(out[:, ids.shape[1]:].cpu(), self.eos_id)}


def _profile(rollout: object, prompts: list[list[int]], tokens: int, name: str) -> None:
    """Print the top CPU-side ops of one ``tokens``-token generate (where a launch-bound decode spends)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        rollout.generate(prompts, n=1, seed=3, response_length=tokens)
    print(f"profile {name}: {len(prompts)} prompts x {tokens} new tokens", flush=True)
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25), flush=True)


def bench_gen(model_dir: Path, args: argparse.Namespace) -> list[dict]:
    """Every rollout alive at once, measured in turn, ``--rounds`` times per batch size.

    The rollouts take turns inside each round, so a cost paid once per new shape (cuDNN builds an
    attention plan for every new sequence length it meets) falls on whichever runs a shape first:
    round 1 shows the cold figure, the last round the warm one, and the ratios use the last.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from repro.workers.rollout_hf import make_rollout

    source = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    vocab = source.config.vocab_size
    rng = random.Random(0)
    prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt_len)] for _ in range(max(args.batches))]
    rollouts, start_s = {}, {}
    for name in args.rollouts:
        t0 = time.time()
        rollouts[name] = PlainGenerate(model_dir, args) if name == "plain" else make_rollout(_gen_config(model_dir, args, name))
        start_s[name] = time.time() - t0
        rollouts[name].load_weights(source.named_parameters())
        rollouts[name].generate(prompts[:4], n=1, seed=1, response_length=16)  # warm-up
    del source
    rows = []
    for b in args.batches:
        for rnd in range(1, args.rounds + 1):
            for name, rollout in rollouts.items():
                torch.cuda.synchronize()
                t0 = time.time()
                out = rollout.generate(prompts[:b], n=1, seed=2)
                torch.cuda.synchronize()
                dt = time.time() - t0
                new = int(out["response_mask"].sum())
                row = {"bench": "gen", "rollout": name, "batch": b, "round": rnd, "prompt_len": args.prompt_len,
                       "max_new_tokens": args.new_tokens, "new_tokens": new, "seconds": round(dt, 3),
                       "new_tokens_per_s": round(new / dt, 1), "engine_start_s": round(start_s[name], 1)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.profile:
        for name, rollout in rollouts.items():
            _profile(rollout, prompts[:max(args.batches)], args.profile, name)
    del rollouts
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def _grpo_overrides(model_dir: Path, data: dict, args: argparse.Namespace, name: str, out: Path) -> list[str]:
    prompts = args.grpo_batch // args.n
    overrides = [
        f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={data['train']}",
        f"data.val_files={data['test']}", "data.max_prompt_length=640", f"data.max_response_length={args.grpo_response}",
        f"data.train_batch_size={prompts}", f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.rollout.name={name}", f"actor_rollout_ref.rollout.gpu_memory_utilization={args.util}",
        f"actor_rollout_ref.rollout.enforce_eager={args.eager}", "actor_rollout_ref.rollout.load_format=dummy",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.ppo_epochs=1", "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.deepspeed.zero_stage=2", "actor_rollout_ref.actor.deepspeed.torch_adam=True",
        "algorithm.adv_estimator=grpo", "critic.enable=False",
        "trainer.device=cuda", "trainer.n_gpus_per_node=1", f"trainer.total_training_steps={args.steps}",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.val_before_train=False",
        f"trainer.experiment_name=rollout_bench_{name}", f"trainer.output_dir={out}", "trainer.progress=plain",
    ]
    return overrides


def bench_grpo(model_dir: Path, work: Path, args: argparse.Namespace) -> list[dict]:
    from repro.data.gsm8k import convert
    from repro.rl.metrics import MetricsLog

    data = convert(ROOT / "fixtures" / "gsm8k", work / "gsm8k")
    env = dict(os.environ)
    env.pop("DS_ACCELERATOR", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    rows = []
    for name in args.rollouts:
        out = work / f"grpo_{name}"
        cmd = [sys.executable, "-c", RUNNER, *_grpo_overrides(model_dir, data, args, name, out)]
        out.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        with open(out / "job.log", "w") as log:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"grpo job with rollout {name} failed (rc {proc.returncode}); log {out / 'job.log'}:\n"
                               + (out / "job.log").read_text()[-4000:])
        metrics = MetricsLog(out / "metrics.tsv").rows
        tail = metrics[-args.tail:]
        row = {"bench": "grpo", "rollout": name, "samples_per_gpu": args.grpo_batch, "response_length": args.grpo_response,
               "steps": len(metrics), "tail": len(tail), "wall_s": round(time.time() - t0, 1)}
        row.update({k: round(sum(r[k] for r in tail) / len(tail), 3) for k in SPLIT_KEYS})
        row["max_nvml_memory_used_gb"] = max(r.get("perf/nvml_memory_used_gb", 0.0) for r in metrics)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def ratios(rows: list[dict]) -> dict:
    """vLLM / HF and HF / plain of new tokens/s per batch, and HF / vLLM of the GRPO step and generation times."""
    by = {(r["bench"], r["rollout"], r.get("batch")): r for r in rows}  # the last round of each wins
    out = {}
    for (bench, name, batch), r in by.items():
        hf = by.get((bench, "hf", batch))
        plain = by.get((bench, "plain", batch))
        if name == "hf" and plain is not None:
            out[f"gen_tokens_per_s_hf_over_plain_batch{batch}"] = round(r["new_tokens_per_s"] / plain["new_tokens_per_s"], 2)
        if name != "vllm" or hf is None:
            continue
        if bench == "gen":
            out[f"gen_tokens_per_s_vllm_over_hf_batch{batch}"] = round(r["new_tokens_per_s"] / hf["new_tokens_per_s"], 2)
        else:
            out["grpo_step_s_hf_over_vllm"] = round(hf["timing_s/step"] / r["timing_s/step"], 2)
            out["grpo_gen_s_hf_over_vllm"] = round(hf["timing_s/gen"] / r["timing_s/gen"], 2)
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m repro.bench.rollout", description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("gen", "grpo", "all"))
    p.add_argument("--rollouts", default="plain,hf,vllm", type=lambda s: s.split(","),
                   help="plain (transformers generate, gen only), hf, vllm")
    p.add_argument("--rounds", type=int, default=2, help="gen: rounds per batch size (round 1 is cold)")
    p.add_argument("--profile", type=int, default=0, help="gen: profile an N-token generate of each rollout")
    p.add_argument("--batches", default="64,128", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--util", type=float, default=0.4, help="rollout.gpu_memory_utilization of the vLLM engine")
    p.add_argument("--eager", action="store_true", help="rollout.enforce_eager=True (no CUDA graphs)")
    p.add_argument("--steps", type=int, default=4, help="GRPO steps per job")
    p.add_argument("--tail", type=int, default=3, help="GRPO steps averaged (the last ones)")
    p.add_argument("--grpo-batch", type=int, default=64, help="GRPO samples per step on the GPU (prompts x n)")
    p.add_argument("--n", type=int, default=4, help="GRPO samples per prompt")
    p.add_argument("--grpo-response", type=int, default=256)
    p.add_argument("--timeout", type=float, default=400.0, help="seconds per GRPO job")
    p.add_argument("--out", default="outputs/rollout_bench")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    bad = [r for r in args.rollouts if r not in ("plain", "hf", "vllm")]
    if bad or args.grpo_batch % args.n or args.tail < 1 or args.rounds < 1:
        print(f"bad arguments: --rollouts {bad} (choose plain, hf, vllm), --grpo-batch must divide by --n, --tail >= 1, --rounds >= 1",
              file=sys.stderr)
        return 2
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    import torch

    model_dir = make_policy_dir(work)
    rows = []
    if args.mode in ("gen", "all"):
        rows += bench_gen(model_dir, args)
    if args.mode in ("grpo", "all"):
        args.rollouts = [r for r in args.rollouts if r != "plain"]
        rows += bench_grpo(model_dir, work, args)
    summary = {"device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "command": " ".join(["python -m repro.bench.rollout", *(argv if argv is not None else sys.argv[1:])]),
               "ratios": ratios(rows)}
    (work / "rollout_bench.json").write_text(json.dumps({**summary, "rows": rows}, indent=1) + "\n")
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
