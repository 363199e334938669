"""The padded batch layout every rollout returns (verl's, see interfaces.md).

Prompts are left-padded to a common width, responses right-padded to ``response_length``; a
response ends at its first EOS, which is kept and counted in ``response_mask``, and every token
after it becomes padding. The HF and vLLM rollouts both build their output here, so a batch
looks the same whichever engine sampled it; sample ``j`` of prompt ``i`` is row ``i * n + j``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from repro.batching.batch import Batch, padded_batch


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int, pad_to: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` of the prompts, left-padded to ``pad_to`` (or the longest)."""
    width = max(len(p) for p in prompts)
    if pad_to is not None:
        if pad_to < width:
            raise ValueError(f"prompt of {width} tokens does not fit prompt_pad_to={pad_to}")
        width = pad_to
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
            mask[i, width - len(p):] = 1
    return ids, mask


def right_pad(samples: Sequence[Sequence[int]], length: int, pad_id: int) -> torch.Tensor:
    """Token lists as rows of width ``length``; a list longer than ``length`` is an engine bug."""
    out = torch.full((len(samples), length), pad_id, dtype=torch.long)
    for i, s in enumerate(samples):
        if len(s) > length:
            raise ValueError(f"rollout sample {i} has {len(s)} tokens, more than response_length={length}")
        if s:
            out[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
    return out


def response_mask(responses: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 up to and including the first EOS (everything when there is none), 0 after."""
    is_eos = (responses == eos_id).long()
    eos_before = is_eos.cumsum(dim=1) - is_eos  # EOS tokens strictly before each position
    return (eos_before == 0).long()


def assemble(prompts: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor,
             pad_id: int, eos_id: int, lengths: torch.Tensor | None = None) -> Batch:
    """The batch of one rollout call from row-aligned prompts and raw responses.

    ``lengths`` (tokens each engine row really produced) cuts a row that stopped short without
    an EOS, e.g. at vLLM's ``max_model_len``; HF ``generate`` rows are full length or end at EOS.
    """
    mask = response_mask(responses, eos_id)
    if lengths is not None:
        mask = mask * (torch.arange(responses.shape[1]) < lengths[:, None]).long()
    return padded_batch(prompts, prompt_mask, responses.masked_fill(mask == 0, pad_id), mask)


def batch_from_samples(prompt_ids: Sequence[Sequence[int]], samples: Sequence[Sequence[int]], n: int, *,
                       pad_id: int, eos_id: int, response_length: int, prompt_pad_to: int | None,
                       sample_log_probs: Sequence[Sequence[float]] | None = None) -> Batch:
    """The batch from token lists: ``samples[i * n + j]`` is sample ``j`` of prompt ``i``.

    ``sample_log_probs`` (the engine's log-prob of each sampled token) becomes ``rollout_log_probs``
    ``[B, R]``, 0 outside ``response_mask``: what the trainer's own log-probs are compared with.
    """
    if len(samples) != len(prompt_ids) * n:
        raise ValueError(f"{len(samples)} samples for {len(prompt_ids)} prompts x n={n}")
    prompts, prompt_mask = left_pad(prompt_ids, pad_id, prompt_pad_to)
    batch = assemble(prompts.repeat_interleave(n, dim=0), prompt_mask.repeat_interleave(n, dim=0),
                     right_pad(samples, response_length, pad_id), pad_id, eos_id,
                     lengths=torch.tensor([len(s) for s in samples], dtype=torch.long))
    if sample_log_probs is not None:
        lps = torch.zeros(batch["responses"].shape, dtype=torch.float32)
        for i, (s, lp) in enumerate(zip(samples, sample_log_probs, strict=True)):
            if len(lp) != len(s):
                raise ValueError(f"rollout sample {i}: {len(lp)} log-probs for {len(s)} tokens")
            if s:
                lps[i, : len(s)] = torch.tensor(list(lp), dtype=torch.float32)
        batch["rollout_log_probs"] = lps * batch["response_mask"]
    return batch
