"""The batch: the one type every batch concept uses, its names, and its row operations.

A :data:`Batch` is a dict of tensors whose first dimension is the sample, in verl's padded
layout (as ``repro.workers.rollout_hf`` makes it): ``input_ids``, ``attention_mask`` and ``position_ids`` ``[B, P+R]``
(prompts left-padded, responses right-padded), ``responses`` and ``response_mask`` ``[B, R]``, and
what the step adds on the driver (``token_level_scores``, ``token_level_rewards``,
``old_log_probs``, ``ref_log_prob``, ``values``, ``advantages``, ``returns``, all ``[B, R]``).

One name per concept, used across the package:

- **rollout batch**: all samples of one RL step on the driver (``data.train_batch_size *
  rollout.n``); a ``Batch``.
- **rank shard**: the contiguous share of the rollout batch that one rank receives
  (:func:`shard_batch`); a ``Batch``. The driver joins the ranks' results with
  :func:`concat_batches`.
- **mini-batch**: one optimizer update's samples; on a rank, ``per_rank_mini`` rows of its shard
  (``repro.workers.mini_batches.MiniBatch``, its size from ``repro.batching.plan``).
- **micro-batch**: one forward/backward, a ``Batch`` of ``ppo_micro_batch_size_per_gpu`` rows
  (:func:`chunks`).
- **token-budget micro-batch**: a micro-batch packed under ``ppo_max_token_len_per_gpu`` tokens
  (``use_dynamic_bsz``; ``repro.batching.token_budget``).

Why a plain dict and not verl's ``TensorDict``/``DataProto``: tensordict is outside the allowed
dependencies, and the workers need nothing it adds here: a dict of tensors pickles through Ray
as it is, DeepSpeed and the models take its tensors directly, and the non-tensor data (prompts'
ground truth, data sources) stays with the driver. The operations below are the only places
that cut or join batches; imports of this module point nowhere inside ``repro``.

On a rank the batch may also carry **host copies** (:func:`with_host_copies`): the masks and positions again, on
the host, under :func:`host_key` names, taken once per worker call so that the index math of every micro-batch
(packing, token budgets) reads them without waiting for the device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

Batch = dict[str, torch.Tensor]


def num_samples(batch: Mapping[str, torch.Tensor]) -> int:
    """Number of samples (rows of ``responses``, else of ``input_ids``)."""
    key = "responses" if "responses" in batch else "input_ids"
    return int(batch[key].shape[0])


HOST_COPIED = ("attention_mask", "position_ids", "response_mask")
"""The entries a rank's batch also carries on the host (:func:`with_host_copies`)."""


_HOST = "@host"


def host_key(key: str) -> str:
    """The name of ``key``'s host copy in a batch."""
    return key + _HOST


def with_host_copies(batch: Mapping[str, Any], source: Mapping[str, Any] | None = None) -> Batch:
    """``batch`` with a host copy of each :data:`HOST_COPIED` entry, taken from ``source`` (the same rows; default
    ``batch``). On a GPU every copy to the host waits for the device to drain, and each micro-batch's packing read
    its masks that way: a wait per micro-batch, after which the device idled until the host had issued the next
    forward (``results/actor_update/README.md``, session 34). Taken once per worker call, before the device has
    work queued, or from the host batch the call received, which costs no copy at all."""
    source = batch if source is None else source
    return {**batch, **{host_key(k): source[k].to("cpu") for k in HOST_COPIED if torch.is_tensor(source.get(k))}}


def host_view(batch: Mapping[str, torch.Tensor], key: str) -> torch.Tensor:
    """``batch[key]`` on the host: its host copy where the batch carries one, else a copy (a device wait on a GPU)."""
    return batch[host_key(key)] if host_key(key) in batch else batch[key].to("cpu")


def seq_lens(batch: Mapping[str, torch.Tensor]) -> list[int]:
    """Real tokens per sample (the attention mask's row sums): what a token budget counts."""
    return host_view(batch, "attention_mask").sum(dim=-1).tolist()


def select(batch: Mapping[str, torch.Tensor], index: Sequence[int] | torch.Tensor) -> Batch:
    """Rows ``index`` of every per-sample tensor of ``batch`` (0-d and non-tensor values dropped)."""
    idx = torch.as_tensor(index, dtype=torch.long)
    # One copy of the index per device, not one per key: on a GPU each host-to-device copy waits
    # for the device (28 of the 0.6B update's 65 syncs were this copy, results/actor_update/README.md).
    on: dict[torch.device, torch.Tensor] = {}
    out: Batch = {}
    for k, v in batch.items():
        if torch.is_tensor(v) and v.dim() > 0:
            if v.device not in on:
                # without waiting for the device: the index is a fresh host tensor, staged by the copy call itself
                on[v.device] = idx.to(v.device, non_blocking=True)
            out[k] = v.index_select(0, on[v.device])
    return out


def pick(batch: Mapping[str, torch.Tensor], keys: Sequence[str]) -> Batch:
    """The entries of ``keys`` that ``batch`` has (what one worker call needs)."""
    return {k: batch[k] for k in keys if k in batch}


def to_device(batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """``batch`` with every tensor moved to ``device`` (host copies and other values as they are)."""
    return {k: v.to(device) if torch.is_tensor(v) and not k.endswith(_HOST) else v for k, v in batch.items()}


def chunks(total: int, size: int) -> list[list[int]]:
    """Consecutive index lists of ``size`` (the last one shorter when ``size`` does not divide)."""
    if size < 1:
        raise ValueError(f"chunk size {size} must be a positive integer")
    return [list(range(s, min(s + size, total))) for s in range(0, total, size)]


def shard_batch(batch: Mapping[str, torch.Tensor], parts: int) -> list[Batch]:
    """``parts`` contiguous rank shards of equal size (the batch plan guarantees divisibility)."""
    size = next(iter(batch.values())).shape[0]
    if size % parts:
        raise ValueError(f"batch of {size} samples cannot be split evenly across {parts} ranks")
    step = size // parts
    return [{k: v[i * step:(i + 1) * step] for k, v in batch.items()} for i in range(parts)]


def split_list(items: Sequence[Any], parts: int) -> list[list[Any]]:
    """Contiguous, nearly equal shards (the first ones one longer when it does not divide)."""
    q, r = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + q + (1 if i < r else 0)
        out.append(list(items[start:end]))
        start = end
    return out


def concat_batches(shards: Sequence[Mapping[str, torch.Tensor]]) -> Batch:
    """Join rank shards (or any batches with the same keys) in order."""
    keys = shards[0].keys()
    for s in shards:
        if s.keys() != keys:
            raise ValueError(f"ranks returned different keys: {sorted(keys)} vs {sorted(s.keys())}")
    return {k: torch.cat([s[k] for s in shards], dim=0) for k in keys}


def padded_batch(prompts: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor,
                 response_mask: torch.Tensor) -> Batch:
    """The five layout entries of a batch from left-padded prompts and right-padded responses.

    ``position_ids`` count the real tokens before each position (0 on the left padding), as the
    rollout's ``generate`` saw them, so a padded forward gives every real token its position.
    """
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    return {
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(dim=1) - 1).clamp(min=0),
        "responses": responses,
        "response_mask": response_mask,
    }


def trimmed(mb: Mapping[str, torch.Tensor]) -> Batch:
    """The layout entries of ``mb`` without the columns that are padding in every row: left of its
    longest prompt and right of its longest response.

    The rollout pads prompts to ``max_prompt_length`` and responses to ``max_response_length``; a
    padded forward over those widths computes every padding position too (768 columns for ~21 real
    tokens a sample at the seed's settings, results/peers/2gpu/README.md). Positions keep their
    ``position_ids``, so every real token is computed as before; what a caller returns per response
    token it pads back to the full width (:func:`pad_responses`). At least one response column stays.
    """
    width = mb["responses"].shape[1]
    prompt_width = mb["input_ids"].shape[1] - width
    # from the masks' host copies where the batch carries them: the bounds need no device value
    held = host_view(mb, "attention_mask")[:, :prompt_width].any(dim=0).nonzero()
    first = int(held[0]) if len(held) else prompt_width
    answered = host_view(mb, "response_mask").any(dim=0).nonzero()
    keep = int(answered[-1]) + 1 if len(answered) else 1
    out = {k: mb[k][:, first:prompt_width + keep] for k in ("input_ids", "attention_mask", "position_ids")}
    out.update({k: mb[k][:, :keep] for k in ("responses", "response_mask")})
    return out


def pad_responses(values: torch.Tensor, width: int) -> torch.Tensor:
    """``[b, r]`` per-response-token values right-padded with zeros to ``width`` (undoes :func:`trimmed`)."""
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))
