"""verl's NO_PADDING micro-batch -> model forward -> per-token tensors nested like ``input_ids``.

verl's engines take a micro-batch whose ``input_ids`` / ``position_ids`` are jagged nested
tensors (one real-token sequence per sample). Two ways to run it, both exact for every real token:

- ``use_remove_padding=True`` (verl's default): the samples back to back in one row, positions
  restarting at 0 per sample; transformers builds the block-causal mask from the positions (see
  ``repro.workers.packing``), and with Ulysses (sp > 1) ``repro.workers.ulysses.token_forward``
  splits the row over the SP group and gathers the per-token outputs back;
- ``use_remove_padding=False``: right-padded ``[B, L]`` with an attention mask (no SP).

The label of a position is the next token of the flat sequence (verl's ``roll`` of the values):
at each sample's last position it is the next sample's first token, a log-prob no loss reads
(``no_padding_2_padding`` takes the positions before each sample's last).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu

from repro.workers import ulysses
from repro.workers.logprob import token_log_probs


def scalar_temperature(micro: TensorDict) -> float:
    """The sampling temperature of the micro-batch (one value: repro's log-probs take a scalar)."""
    t = micro["temperature"] if "temperature" in micro.keys() else tu.get_non_tensor_data(
        data=micro, key="temperature", default=1.0)
    if torch.is_tensor(t):
        flat = (t.values() if t.is_nested else t).reshape(-1).float()
        if flat.numel() and not bool((flat == flat[0]).all()):
            raise ValueError("the DeepSpeed engine takes one temperature per micro-batch; got per-sample values "
                             f"{sorted(set(flat.tolist()))}")
        t = float(flat[0]) if flat.numel() else 1.0
    return float(t)


def token_log_probs_of(out: Any, labels: torch.Tensor, temperature: float,
                       entropy: bool) -> tuple[torch.Tensor, ...]:
    lp, ent = token_log_probs(out.logits, labels, temperature=temperature, with_entropy=entropy)
    return (lp, ent) if entropy else (lp,)


def per_token(forward: Callable[..., Any], micro: TensorDict, sp: int,
              fn: Callable[[Any, torch.Tensor], tuple[torch.Tensor, ...]],
              packed_only: bool = False) -> tuple[torch.Tensor, ...]:
    """``fn(model_output, labels)`` of every real token, each result nested like ``input_ids``. ``packed_only``: the
    model attends through repro's varlen path, which reads no attention mask, so padded rows are refused."""
    ids, pos = micro["input_ids"], micro["position_ids"]
    if pos.dim() == 3:
        raise ValueError("the DeepSpeed engine takes 1-D position_ids per sample (no mrope / vision models)")
    offsets = ids.offsets()
    packed = tu.get_non_tensor_data(data=micro, key="use_remove_padding", default=True)
    if packed_only and not packed:
        raise ValueError("a micro-batch with use_remove_padding=False reached a DeepSpeed engine built with "
                         "deepspeed.use_remove_padding=true (FlashAttention over packed rows, no attention mask read); "
                         "set the two alike")
    if packed or sp > 1:
        flat_ids, flat_pos = ids.values().unsqueeze(0), pos.values().unsqueeze(0)
        # token_forward's label of the row's last position is a pad where verl's roll wraps to the
        # first token: a position no loss reads (module docstring).
        flat = [o[0] for o in ulysses.token_forward(forward, flat_ids, flat_pos, sp, fn)]
    else:
        lens = offsets.diff()
        width = int(lens.max())
        pad_id = tu.get_non_tensor_data(data=micro, key="pad_token_id", default=0)
        padded_ids = torch.nested.to_padded_tensor(ids, padding=pad_id, output_size=(len(lens), width))
        padded_pos = torch.nested.to_padded_tensor(pos, padding=0, output_size=(len(lens), width))
        mask = torch.arange(width, device=lens.device)[None] < lens[:, None]
        out = forward(input_ids=padded_ids, attention_mask=mask.long(), position_ids=padded_pos, use_cache=False)
        # The flat sequence's next token, laid back out as [B, L] (verl's roll over the values).
        labels = torch.zeros_like(padded_ids)
        labels[mask] = torch.roll(ids.values(), shifts=-1, dims=0)
        flat = [o[mask] for o in fn(out, labels)]
    return tuple(torch.nested.nested_tensor_from_jagged(t, offsets) for t in flat)

