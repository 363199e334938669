"""A rank's shard -> mini-batches -> micro-batches, and the counts every rank must agree on.

Used by the actor and the critic (names as in ``repro.batching.batch``). The rank shard holds
``num_mini_batches * per_rank_mini`` samples; each mini-batch is one optimizer update, cut into
fixed-size or token-budget micro-batches. Everything that differs between ranks and would
change which collectives they issue (the number of micro-batches) or the loss normalisation
(token and sequence counts of the whole mini-batch, over all dp ranks) is agreed with at most
two all-reduces per update call, issued by every rank before any forward.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from repro.batching.batch import Batch, chunks, host_view, num_samples, select, seq_lens
from repro.batching.token_budget import min_micro_batches, split_micro_batches_by_tokens
from repro.workers.engine import all_reduce_counts

if TYPE_CHECKING:
    from repro.batching.plan import RoleBatchPlan


@dataclass
class MiniBatch:
    """One mini-batch: an optimizer update's share of this rank, as its micro-batches."""

    micro_batches: list[Batch]
    global_tokens: float
    """Response tokens of the whole mini-batch over all dp ranks (token-mean denominator)."""
    global_seqs: float
    """Samples with a response token in the whole mini-batch over all dp ranks (seq-mean denominator;
    at least 1)."""
    local_tokens: float


def plan_mini_batches(
    batch: Batch,
    per_rank_mini: int,
    epochs: int,
    *,
    shuffle: bool,
    seed: int,
    micro: int | None,
    max_token_len: int | None,
    sp: int = 1,
) -> list[MiniBatch]:
    """All mini-batches of an update call (every epoch), with globally agreed counts.

    ``micro`` set: fixed micro-batches of that many samples. ``max_token_len`` set: token-budget
    micro-batches, as many on every rank as the rank that needs the most. ``sp``: the ranks of an
    SP group hold the same samples, so the world's sums count each sample sp times.
    """
    total = num_samples(batch)
    if total % per_rank_mini:
        raise ValueError(
            f"this rank received {total} samples, not a multiple of its mini-batch of {per_rank_mini} "
            "(ppo_mini_batch_size * rollout.n / dp)"
        )
    orders: list[list[int]] = []
    for epoch in range(epochs):
        if shuffle:
            gen = torch.Generator().manual_seed(seed + epoch)
            order = torch.randperm(total, generator=gen).tolist()
        else:
            order = list(range(total))
        orders += [[order[i] for i in chunk] for chunk in chunks(total, per_rank_mini)]
    minis = [select(batch, idx) for idx in orders]
    mask_key = "response_mask"
    local = [float(host_view(m, mask_key).sum()) for m in minis]
    # An empty (aborted) response counts for no sequence, as in repro.rl.algorithms.agg_loss and verl.
    nonempty = [float((host_view(m, mask_key).sum(dim=-1) > 0).sum()) for m in minis]
    # The ranks of one sequence-parallel group hold the same samples: count each group once.
    counts = [c / sp for c in all_reduce_counts(local + nonempty)]
    tokens, seqs = counts[: len(minis)], counts[len(minis):]
    if max_token_len is not None:
        need = [float(min_micro_batches(seq_lens(m), max_token_len)) for m in minis]
        agreed = [int(n) for n in all_reduce_counts(need, op="max")]
        splits = [split_micro_batches_by_tokens(seq_lens(m), max_token_len, n) for m, n in zip(minis, agreed, strict=True)]
    else:
        assert micro is not None and micro > 0
        splits = [chunks(per_rank_mini, micro) for _ in minis]
    return [
        MiniBatch([select(m, idx) for idx in split], tokens[i], max(seqs[i], 1.0), local[i])
        for i, (m, split) in enumerate(zip(minis, splits, strict=True))
    ]


def forward_micro_batches(batch: Batch, micro: int | None, max_token_len: int | None) -> list[list[int]]:
    """Index lists of the forward-only micro-batches (log-probs, values); equal count on all ranks."""
    total = num_samples(batch)
    if max_token_len is not None:
        lens = seq_lens(batch)
        n = int(all_reduce_counts([float(min_micro_batches(lens, max_token_len))], op="max")[0])
        return split_micro_batches_by_tokens(lens, max_token_len, n)
    return chunks(total, micro or total)


def update_mini_batches(batch: Batch, plan: RoleBatchPlan, section: Any, data_seed: int, updates: int,
                        sp: int = 1) -> list[MiniBatch]:
    """The mini-batches of a role's update call, as :func:`plan_mini_batches` cuts them by ``plan``.

    ``section`` is the role's config (``ppo_epochs``, ``shuffle``, ``data_loader_seed``, else
    ``data_seed``); ``updates`` (the role's update calls so far) moves the shuffle on each call.
    """
    seed = (section.data_loader_seed if section.data_loader_seed is not None else data_seed) + 7919 * updates
    return plan_mini_batches(
        batch, plan.per_rank_mini, section.ppo_epochs, shuffle=section.shuffle, seed=seed,
        micro=None if plan.dynamic else plan.micro,
        max_token_len=plan.max_token_len if plan.dynamic else None, sp=sp,
    )


def mean_update_stats(per_update: Sequence[Sequence[Mapping[str, Any]]], local_tokens: Sequence[float],
                      per_token: Sequence[str]) -> dict[str, float]:
    """One value per statistic over an update call: each update's micro-batch statistics summed
    (keys in ``per_token`` divided by the update's local response tokens), then the mean over the
    updates that report the key."""
    summed = []
    for stats, tokens in zip(per_update, local_tokens, strict=True):
        total = {k: float(sum(s.get(k, 0.0) for s in stats)) for k in {k for s in stats for k in s}}
        for key in per_token:
            if key in total:
                total[key] /= max(tokens, 1.0)
        summed.append(total)
    keys = {k for s in summed for k in s}
    return {k: sum(s[k] for s in summed if k in s) / sum(1 for s in summed if k in s) for k in keys}
