"""TRL's ``GRPOTrainer`` (DeepSpeed, vLLM colocate) on repro's task, in a peer recipe's settings.

    python -m repro.integrations.trl.peer --policy DIR --train PARQUET --steps 30 --out DIR
    torchrun --nproc-per-node 2 -m repro.integrations.trl.peer --recipe seed --policy DIR --train PARQUET --out DIR

The recipe (``repro.config.peer_recipes``) is read through repro's own config loader and written in
TRL's keys by :func:`grpo_kwargs`: prompts x completions per rollout step (``steps_per_generation``
micro-batches make one generation), epochs (``num_iterations``), mini-batches (TRL's optimizer steps,
``gradient_accumulation_steps`` micro-batches each), lengths, sampling, lr (constant), AdamW's
settings, grad clip, clip range, no KL (``beta=0``), group-normalised advantages
(``scale_rewards='group'``), token-mean loss over the mini-batch (``loss_type='dapo'``, verl's
``token-mean``), no importance weights against vLLM's log-probs (verl's default), repro's reward
with the recipe's ``reward_kwargs``, vLLM's share, length and sleep mode, activation checkpointing,
bf16, the DeepSpeed ZeRO stage with the Trainer's own torch AdamW. ``--micro`` samples per
micro-batch and ``--vllm-sleep`` are the settings the peer benchmark gives every peer alike.

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

from repro.config.peer_recipes import RECIPES, recipe

LOSS_TYPE = {"token-mean": "dapo"}
"""verl's ``loss_agg_mode`` -> TRL's ``loss_type`` (DAPO's loss is the token mean over the mini-batch)."""


def _checkpointing(value: bool | str) -> bool:
    # TRL takes a bool: an "auto" run of repro's would be compared with a fixed choice of TRL's.
    if value == "auto":
        raise ValueError("actor_rollout_ref.model.enable_gradient_checkpointing=auto has no TRL equivalent; "
                         "choose true or false for a peer run")
    return bool(value)


def grpo_kwargs(cfg, gpus: int, micro: int, vllm_sleep: bool, steps: int) -> dict:
    """``GRPOConfig`` keywords read off repro's config ``cfg`` of a peer recipe: the same batch, lengths,
    sampling, optimizer, loss, vLLM share and precision in TRL's keys, ``micro`` samples per micro-batch
    on each of ``gpus`` ranks. ``ValueError`` for a setting TRL cannot express."""
    actor, rollout, optim = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor.optim
    samples = cfg.data.train_batch_size * rollout.n
    mini = actor.ppo_mini_batch_size * rollout.n
    if mini % (micro * gpus) or samples % mini:
        raise ValueError(f"micro {micro} x {gpus} GPUs must divide the mini-batch of {mini} samples, which divides {samples}")
    if actor.loss_agg_mode not in LOSS_TYPE or actor.use_kl_loss or cfg.algorithm.use_kl_in_reward:
        raise ValueError(f"TRL's peer speaks loss_agg_mode {sorted(LOSS_TYPE)} without KL, not {actor.loss_agg_mode!r}")
    accumulation = mini // (micro * gpus)
    # TRL counts micro-batches: an optimizer step every gradient_accumulation_steps of them, a generation
    # every steps_per_generation (so each generation is one rollout step's samples), reused num_iterations times.
    return dict(
        per_device_train_batch_size=micro, gradient_accumulation_steps=accumulation,
        steps_per_generation=samples // (micro * gpus), num_iterations=actor.ppo_epochs, num_generations=rollout.n,
        max_completion_length=cfg.data.max_response_length,
        temperature=rollout.temperature, top_p=rollout.top_p, top_k=0 if rollout.top_k < 0 else rollout.top_k,  # TRL: 0 is off (verl: -1)
        learning_rate=optim.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=optim.weight_decay,
        adam_beta1=optim.betas[0], adam_beta2=optim.betas[1], adam_epsilon=optim.eps, max_grad_norm=actor.grad_clip,
        epsilon=actor.clip_ratio_low or actor.clip_ratio, epsilon_high=actor.clip_ratio_high or actor.clip_ratio,
        beta=0.0, scale_rewards="group" if cfg.algorithm.norm_adv_by_std_in_grpo else "none",
        loss_type=LOSS_TYPE[actor.loss_agg_mode],
        # verl and repro train on the sampled tokens without importance weights against vLLM's log-probs.
        vllm_importance_sampling_correction=False,
        use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=rollout.gpu_memory_utilization,
        vllm_max_model_length=rollout.max_model_len, vllm_enable_sleep_mode=vllm_sleep,
        bf16=True, gradient_checkpointing=_checkpointing(cfg.actor_rollout_ref.model.enable_gradient_checkpointing),
        max_steps=steps * rollout_optimizer_steps(cfg), logging_steps=1, report_to="none", save_strategy="no",
        seed=cfg.trainer.seed, data_seed=cfg.data.seed, disable_dropout=True,
        deepspeed={"zero_optimization": {"stage": actor.deepspeed.zero_stage}, "bf16": {"enabled": "auto"},
                   "gradient_clipping": "auto", "train_micro_batch_size_per_gpu": "auto",
                   "gradient_accumulation_steps": "auto", "train_batch_size": "auto"},
    )


def rollout_optimizer_steps(cfg) -> int:
    """Optimizer steps in one rollout step: epochs x mini-batches (TRL's ``global_step`` counts these)."""
    actor = cfg.actor_rollout_ref.actor
    return actor.ppo_epochs * cfg.data.train_batch_size // actor.ppo_mini_batch_size


def vllm_max_num_seqs(kwargs: dict) -> int:
    """The ``max_num_seqs`` TRL gives its colocated vLLM (it has no key for it): per-device batch x
    steps_per_generation (x tensor parallel 1)."""
    return kwargs["per_device_train_batch_size"] * kwargs["steps_per_generation"]


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
    p.add_argument("--recipe", choices=sorted(RECIPES), default="tiny", help="peer recipe (repro.config.peer_recipes)")
    p.add_argument("--steps", type=int, default=30, help="rollout steps")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--micro", type=int, default=None, help="samples per micro-batch on one GPU (default: the recipe's)")
    p.add_argument("--vllm-sleep", action=argparse.BooleanOptionalAction, default=None,
                   help="vllm_enable_sleep_mode (default: the recipe's)")
    args = p.parse_args(argv)
    r = recipe(args.recipe)
    from repro.config.loader import load_config

    cfg = load_config([*r.overrides, "trainer.dry_run=True"], config_name=r.preset)
    gpus = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        kwargs = grpo_kwargs(cfg, gpus, r.micro if args.micro is None else args.micro,
                             r.vllm_sleep if args.vllm_sleep is None else args.vllm_sleep, args.steps)
    except ValueError as e:
        p.error(str(e))
    per_rollout = rollout_optimizer_steps(cfg)
    # One process (torchrun sets these for several).
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": os.environ.get("MASTER_PORT", "29517")}.items():
        os.environ.setdefault(key, value)
    rank0 = os.environ["RANK"] == "0"

    import torch
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from repro.integrations.verl.reward import compute_score
    from repro.rl.metrics import MetricsLog

    args.out.mkdir(parents=True, exist_ok=True)
    if rank0:
        (args.out / "metrics.tsv").unlink(missing_ok=True)  # this peer's own output of an earlier run
    metrics = MetricsLog(args.out / "metrics.tsv")
    tokenizer = AutoTokenizer.from_pretrained(args.policy)
    scores: list[float] = []
    reward_kwargs = dict(cfg.reward.reward_kwargs)

    def reward(prompts, completions, ground_truth, data_source, **_):
        # The score function verl's peers get (the recipe's reward settings), called the same way.
        values = [compute_score(src, c, gt, **reward_kwargs)
                  for c, gt, src in zip(completions, ground_truth, data_source, strict=True)]
        scores.append(sum(values) / len(values))
        return values

    config = GRPOConfig(output_dir=str(args.out / "trainer"), **kwargs)
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
        """One metrics row per rollout step (every ``per_rollout`` optimizer steps), written by rank 0 as it
        ends; the score and tokens are rank 0's share of the step (each rank scores its own samples)."""

        def __init__(self) -> None:
            self.last = time.perf_counter()

        def on_step_end(self, _args, state, _control, **_kw):
            if state.global_step % per_rollout:
                return
            now = time.perf_counter()
            step = state.global_step // per_rollout - 1
            row = {"step": step + 1, "timing_s/step": now - self.last, "timing_s/gen": gen_s[step],
                   "timing_s/update_actor": now - self.last - gen_s[step], "critic/score/mean": scores[step],
                   "perf/total_num_tokens": tokens[step] * gpus,
                   "perf/max_memory_allocated_gb": torch.cuda.max_memory_allocated() / 2**30}
            self.last = now
            if rank0:
                metrics.append(row)
                print(json.dumps(row), flush=True)

    trainer.add_callback(RolloutSteps())
    trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
