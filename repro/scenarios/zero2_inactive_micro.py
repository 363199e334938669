"""The ZeRO-2 hang: a rank skips backward for a micro-batch with no active tokens.

Two data-parallel ranks train a tiny language model with DeepSpeed ZeRO-2 at gradient
accumulation 2. Rank 0's second micro-batch has an all-zero response mask. With
``skip_inactive=True`` rank 0 skips ``engine.backward`` (and ``engine.step``) for it, the
historical shortcut, so it never enters the gradient reduction that rank 1's backward runs for
that micro-batch: rank 0 goes straight on to the worker's 1-element loss all_reduce (default
group) while rank 1 is in DeepSpeed's bucketed gradient all_reduce (DeepSpeed's data-parallel
group). On gloo that size mismatch
aborts a rank; on NCCL it hangs until the process-group timeout. With ``skip_inactive=False``
the fully masked micro-batch still runs backward (its loss is an exact zero) and the ranks issue
identical collectives.

The actor worker's guarded shortcut will route through :func:`run` later; until then the
scenario drives a DeepSpeed engine directly.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

VOCAB, HIDDEN, SEQ, MICRO, GAS = 64, 32, 8, 2, 2


class TinyLM(nn.Module):
    """Embedding -> MLP -> vocabulary logits: enough parameters for several ZeRO-2 buckets."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN))
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        return self.head(h + self.mlp(h))


def ds_config(reduce_bucket_size: int = 2000) -> dict[str, Any]:
    """ZeRO-2, fp32, torch AdamW (no JIT ops), small buckets so the reduction has several collectives."""
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": GAS,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {
            "stage": 2,
            "reduce_bucket_size": reduce_bucket_size,
            "allgather_bucket_size": reduce_bucket_size,
            "overlap_comm": False,
            "contiguous_gradients": True,
        },
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def micro_batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input ids, response mask) per micro-batch; rank 0's last micro-batch has no active token."""
    g = torch.Generator().manual_seed(1234 + rank)
    batches = []
    for m in range(GAS):
        ids = torch.randint(0, VOCAB, (MICRO, SEQ), generator=g)
        mask = torch.ones(MICRO, SEQ)
        mask[:, : SEQ // 2] = 0  # prompt tokens
        if rank == 0 and m == GAS - 1:
            mask.zero_()
        batches.append((ids, mask))
    return batches


def masked_loss(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy averaged over active tokens; an exact 0 (with a graph) when none are."""
    nll = nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1), reduction="none"
    )
    m = mask[:, 1:].reshape(-1)
    return (nll * m).sum() / m.sum().clamp(min=1.0)


def run(rank: int, world_size: int, skip_inactive: bool, steps: int = 1) -> dict[str, Any]:
    """One or more optimizer steps of the scenario; returns per-step mean losses and a parameter checksum.

    Expects the default process group (gloo or NCCL) and deepspeed.comm to be initialised
    (``repro.distributed.init_distributed``).
    """
    import deepspeed

    if world_size < 2:
        raise ValueError(f"the ZeRO-2 divergence needs world_size >= 2, got {world_size}")
    torch.manual_seed(0)
    model = TinyLM()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config())
    device = next(engine.module.parameters()).device
    losses = []
    for _ in range(steps):
        total = torch.zeros(1, device=device)
        for ids, mask in micro_batches(rank):
            ids, mask = ids.to(device), mask.to(device)
            loss = masked_loss(engine(ids), ids, mask)
            if skip_inactive and mask.sum() == 0:
                # The historical shortcut: no active tokens, "nothing to learn", skip backward
                # (and the engine step that belongs to it).
                continue
            engine.backward(loss)
            engine.step()
            total += loss.detach()
        # The worker averages the loss over data-parallel ranks for its metrics. A rank that
        # skipped its last backward gets here while its peer is still in that backward's
        # gradient reduction.
        dist.all_reduce(total)
        losses.append(total.item() / world_size / GAS)
    checksum = sum(float(p.detach().float().sum()) for p in engine.module.parameters())
    return {"losses": losses, "param_checksum": checksum}
