"""TRL's ``GRPOTrainer`` (DeepSpeed ZeRO-2, vLLM colocate) on repro's tiny task, in its recipe.

    python -m repro.integrations.trl.peer --policy DIR --train PARQUET --steps 30 --out DIR

The ``grpo_tiny`` recipe in TRL's keys: 32 prompts x 8 completions per rollout step, 12 new
tokens, temperature 1, lr 1e-4 constant, 2 epochs (``num_iterations``) x 2 mini-batches
(``steps_per_generation``: TRL's optimizer steps are mini-batches, so one rollout step is 4 of
them), clip 0.2, no KL (``beta=0``), grad clip 1.0, group-normalised advantages
(``scale_rewards='group'``), token-mean loss over the mini-batch (``loss_type='dapo'``, verl's
``token-mean``), repro's reward (strict ``#### N``, 0.1 for a formatted wrong answer), torch
AdamW under DeepSpeed ZeRO-2 (no optimizer in the DeepSpeed config: the Trainer's own), bf16, no
activation checkpointing. ``--micro`` samples per micro-batch (default: one micro-batch a
mini-batch) and ``--vllm-sleep`` are the settings the peer benchmark gives every peer alike.

Each rollout step becomes one ``metrics.tsv`` row in verl's names: ``timing_s/step`` (wall time
between rollout-step ends), ``timing_s/gen`` (TRL's ``_generate_and_score_completions``: vLLM,
reward and old log-probs; TRL does not split them), ``timing_s/update_actor`` (the rest),
``critic/score/mean``, ``perf/total_num_tokens`` (prompt + completion tokens) and
``perf/max_memory_allocated_gb``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from repro.config.presets import samples_per_mini_batch

# TRL counts micro-batches: an optimizer step every gradient_accumulation_steps of them, a rollout
# every num_iterations x steps_per_generation; with steps_per_generation = 2 x accumulation a rollout
# step is 2 epochs x 2 mini-batches = 4 optimizer steps whatever the micro-batch.
STEPS_PER_ROLLOUT = 4
MINI_BATCH = samples_per_mini_batch("grpo_tiny")  # 16 prompts x 8


def _dataset(train: Path, tokenizer):
    """TRL's standard (text) format: the chat-templated prompt string and the answer column."""
    import pyarrow.parquet as pq
    from datasets import Dataset

    rows = pq.read_table(train).to_pylist()
    return Dataset.from_list([{
        "prompt": tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False),
        "ground_truth": r["reward_model"]["ground_truth"], "data_source": r["data_source"]} for r in rows])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m repro.integrations.trl.peer", description=__doc__.split("\n")[0])
    p.add_argument("--policy", type=Path, required=True)
    p.add_argument("--train", type=Path, required=True)
    p.add_argument("--steps", type=int, default=30, help="rollout steps")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--util", type=float, default=0.3, help="vllm_gpu_memory_utilization")
    p.add_argument("--micro", type=int, default=MINI_BATCH, help=f"samples per micro-batch; divides {MINI_BATCH}")
    p.add_argument("--vllm-sleep", action=argparse.BooleanOptionalAction, default=False,
                   help="vllm_enable_sleep_mode (TRL's default: off)")
    args = p.parse_args(argv)
    if args.micro < 1 or MINI_BATCH % args.micro:
        p.error(f"--micro {args.micro}: must divide the mini-batch of {MINI_BATCH} samples")
    accumulation = MINI_BATCH // args.micro
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": os.environ.get("MASTER_PORT", "29517")}.items():
        os.environ.setdefault(key, value)

    import torch
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from repro.integrations.verl.reward import compute_score
    from repro.rl.metrics import MetricsLog

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "metrics.tsv").unlink(missing_ok=True)  # this peer's own output of an earlier run
    metrics = MetricsLog(args.out / "metrics.tsv")
    tokenizer = AutoTokenizer.from_pretrained(args.policy)
    scores: list[float] = []

    def reward(prompts, completions, ground_truth, data_source, **_):
        # The score function verl's peers get (the grpo_tiny reward settings), called the same way.
        values = [compute_score(src, c, gt) for c, gt, src in zip(completions, ground_truth, data_source, strict=True)]
        scores.append(sum(values) / len(values))
        return values

    config = GRPOConfig(
        output_dir=str(args.out / "trainer"), per_device_train_batch_size=args.micro,
        gradient_accumulation_steps=accumulation, steps_per_generation=2 * accumulation, num_iterations=2,
        num_generations=8, max_completion_length=12,
        temperature=1.0, top_p=1.0, learning_rate=1e-4, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.01, max_grad_norm=1.0, epsilon=0.2, beta=0.0, scale_rewards="group", loss_type="dapo",
        use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=args.util,
        vllm_enable_sleep_mode=args.vllm_sleep, bf16=True, gradient_checkpointing=False,
        max_steps=args.steps * STEPS_PER_ROLLOUT, logging_steps=1, report_to="none", save_strategy="no",
        seed=1, data_seed=0, disable_dropout=True,
        deepspeed={"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}, "gradient_clipping": "auto",
                   "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                   "train_batch_size": "auto"},
    )
    trainer = GRPOTrainer(model=str(args.policy), reward_funcs=reward, args=config,
                          train_dataset=_dataset(args.train, tokenizer), processing_class=tokenizer)

    gen_s: list[float] = []
    tokens: list[int] = []
    inner = trainer._generate_and_score_completions

    def timed(inputs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = inner(inputs)
        torch.cuda.synchronize()
        gen_s.append(time.perf_counter() - t0)
        tokens.append(int(out["prompt_mask"].sum()) + int(out["completion_mask"].sum()))
        return out

    trainer._generate_and_score_completions = timed

    class RolloutSteps(TrainerCallback):
        """One metrics row per rollout step (every STEPS_PER_ROLLOUT optimizer steps), written as it ends."""

        def __init__(self) -> None:
            self.last = time.perf_counter()

        def on_step_end(self, _args, state, _control, **_kw):
            if state.global_step % STEPS_PER_ROLLOUT:
                return
            now = time.perf_counter()
            step = len(metrics.rows)
            row = {"step": step + 1, "timing_s/step": now - self.last, "timing_s/gen": gen_s[step],
                   "timing_s/update_actor": now - self.last - gen_s[step], "critic/score/mean": scores[step],
                   "perf/total_num_tokens": tokens[step],
                   "perf/max_memory_allocated_gb": torch.cuda.max_memory_allocated() / 2**30}
            metrics.append(row)
            self.last = now
            print(json.dumps(row), flush=True)

    trainer.add_callback(RolloutSteps())
    trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
