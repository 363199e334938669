"""The ZeRO-2 hang: the actor skips a micro-batch that has no active tokens on one rank only.

Two data-parallel ranks run the reference actor (:class:`repro.workers.actor.ActorWorker`,
``update_policy``) at ZeRO-2 with one mini-batch of two micro-batches per rank. Rank 0's second
sample has an empty response (``response_mask`` all zero). With ``skip_inactive=True`` the
worker's guarded shortcut is forced on (``actor.skip_inactive_micro_batches`` plus
``actor.unsafe_allow_skip_in_data_parallel``): rank 0 skips that micro-batch, finishes its
backward early and enters DeepSpeed's optimizer step, whose first collective is the 1-element
grad-norm all_reduce, while rank 1 runs the second micro-batch's backward and enters the
gradient reduction (an all_reduce of every gradient element). On gloo that size mismatch aborts
a rank; on NCCL it hangs until the process-group timeout. With ``skip_inactive=False`` (the
default config) the fully masked micro-batch still runs forward and backward (its loss is an
exact zero) and the ranks issue identical collectives.

Launch it on 2 local ranks with the collective tracer::

    python -m repro.collectives_trace launch --nproc-per-node 2 --check every --out DIR -- \\
        repro/scenarios/zero2_inactive_micro.py --skip-inactive

(or ``... -- -m repro.scenarios.zero2_inactive_micro --skip-inactive``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from repro.batching.batch import Batch, padded_batch
from repro.data.tiny_model import TOY_VOCAB, toy_qwen3_config

PROMPT_LEN = RESPONSE_LEN = 4
SAMPLES_PER_RANK = 2
"""One mini-batch of two 1-sample micro-batches per rank."""
INACTIVE_RANK, INACTIVE_SAMPLE = 0, 1
"""Rank 0's second sample (its second micro-batch) has an empty response."""


def make_model_dir(path: str | os.PathLike[str], seed: int = 1234) -> str:
    """The tiny Qwen3 causal LM saved as a Hugging Face folder (same seed, same weights on every rank)."""
    from safetensors.torch import save_file
    from transformers import Qwen3ForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file():
        torch.manual_seed(seed)
        # The toy Qwen3 has parameters of several shapes, so the gradient reduction is a real bucket.
        model = Qwen3ForCausalLM(toy_qwen3_config()).float()
        # Written by hand: ``save_pretrained`` writes nothing on ranks other than 0 once a process
        # group exists, and each rank needs its own folder here. The tied lm_head is left out, as
        # Hugging Face does.
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
        save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
        model.config.save_pretrained(path)  # last: config.json marks a complete folder
    return str(path)


def make_config(model_dir: str, world_size: int, skip_inactive: bool) -> Any:
    """A validated RunConfig: actor at ZeRO-2, fp32, torch AdamW, micro 1 x GAS 2 per rank."""
    from repro.config.loader import load_config

    overrides = [
        f"trainer.n_gpus_per_node={world_size}",
        "trainer.nnodes=1",
        f"data.train_batch_size={SAMPLES_PER_RANK * world_size // 2}",
        "actor_rollout_ref.rollout.n=2",
        "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.model.path={model_dir}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={SAMPLES_PER_RANK * world_size // 2}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.deepspeed.zero_stage=2",
        "actor_rollout_ref.actor.deepspeed.model_dtype=float32",
        "actor_rollout_ref.actor.deepspeed.torch_adam=True",
    ]
    if skip_inactive:
        overrides += [
            "actor_rollout_ref.actor.skip_inactive_micro_batches=True",
            "actor_rollout_ref.actor.unsafe_allow_skip_in_data_parallel=True",
        ]
    return load_config(overrides)


def make_batch(rank: int, seed: int = 7) -> Batch:
    """This rank's update batch in verl's padded layout; rank 0's second response is empty."""
    vocab = TOY_VOCAB
    gen = torch.Generator().manual_seed(seed + rank)
    b = SAMPLES_PER_RANK
    prompt = torch.randint(1, vocab, (b, PROMPT_LEN), generator=gen)
    responses = torch.randint(1, vocab, (b, RESPONSE_LEN), generator=gen)
    response_mask = torch.ones(b, RESPONSE_LEN, dtype=torch.long)
    if rank == INACTIVE_RANK:
        response_mask[INACTIVE_SAMPLE] = 0
    responses = responses * response_mask
    prompt_mask = torch.ones(b, PROMPT_LEN, dtype=torch.long)
    fmask = response_mask.float()
    return {
        **padded_batch(prompt, prompt_mask, responses, response_mask),
        "old_log_probs": (-4.0 + 0.3 * torch.randn(b, RESPONSE_LEN, generator=gen)) * fmask,
        "advantages": torch.randn(b, RESPONSE_LEN, generator=gen) * fmask,
    }


def run(
    rank: int, world_size: int, skip_inactive: bool, *, model_dir: str | None = None, steps: int = 1
) -> dict[str, Any]:
    """``steps`` actor updates of the scenario; returns the worker's metrics and a parameter checksum.

    ``model_dir``: a tiny Qwen3 folder shared by the ranks; by default each rank builds the same
    one (fixed seed) in its own temporary folder. Initialises the process group from the env://
    variables unless one exists (``repro.cluster.process_group.init_distributed``).
    """
    from repro.workers.actor import ActorWorker

    if world_size < 2:
        raise ValueError(f"the ZeRO-2 divergence needs world_size >= 2, got {world_size}")
    with tempfile.TemporaryDirectory(prefix=f"zero2_inactive_rank{rank}_") as tmp:
        model_dir = make_model_dir(model_dir or Path(tmp, "model"))
        worker = ActorWorker(make_config(model_dir, world_size, skip_inactive))
        metrics = [worker.update_policy(make_batch(rank)) for _ in range(steps)]
    checksum = sum(float(p.detach().float().sum()) for p in worker.engine.module.parameters())
    return {"metrics": metrics, "param_checksum": checksum}


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``launch`` / torchrun: reads RANK and WORLD_SIZE from the environment."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--skip-inactive", action="store_true", help="force the inactive-micro-batch shortcut on")
    p.add_argument("--steps", type=int, default=1, help="actor updates (default 1)")
    args = p.parse_args(argv)
    for key in ("RANK", "WORLD_SIZE"):
        if key not in os.environ:
            raise ValueError(
                f"{key} is not set: start this scenario with a launcher (collectives_trace launch, torchrun)"
            )
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out = run(rank, world, args.skip_inactive, steps=args.steps)
    print(
        f"rank {rank}: pg_loss {[m['actor/pg_loss'] for m in out['metrics']]} "
        f"param checksum {out['param_checksum']:.6f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
