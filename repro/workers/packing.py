"""Remove padding (``use_remove_padding=True``): a micro-batch's real tokens packed into rows.

verl's padded layout spends attention and MLP work on pad tokens (left-padded prompts,
right-padded responses). Packing copies each sample's real tokens (the attention mask's ones,
contiguous in that layout) back to back into rows, first-fit under a token capacity (the padded
width ``S``, or the token budget of ``use_dynamic_bsz`` when smaller: no row is longer than a
padded row, so no attention matrix grows past the padded one), and passes only
``position_ids`` restarting at 0 per sample. Without an attention mask, transformers builds a
block-causal mask from those ``position_ids`` (``masking_utils.find_packed_sequence_indices``;
FlashAttention-2 reads the same boundaries), so each token sees exactly its own sample's
prefix, as in the padded batch. Row tails are filled with pad tokens at position 0, each its
own one-token block. Per-token outputs are scattered back to the padded ``[B, S]`` layout
with zeros on padding. With FlashAttention over the samples (:mod:`repro.workers.varlen`) no
attention matrix exists, so the whole micro-batch goes into one row (``one_row``).

Only the positions that predict a response token need logits (:meth:`PackedBatch.response_slots`):
the padded path asks the model for the response's logits alone (``logits_to_keep``), and the
packed path asks for the packed columns that hold those positions, so that the vocabulary-wide
head and log-softmax do not run over the prompts.

The index math runs on the host, from one copy of each mask: on a GPU, the per-sample ``nonzero``
and ``tolist`` it replaced were a device sync each (about one a sample, on a host-bound step), and
the indices go to the device without waiting (``non_blocking``). The workers pass the masks' host copies
(``repro.batching.batch.host_view``), so packing a micro-batch waits for no device work at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from repro.batching.token_budget import first_fit


@dataclass
class PackedBatch:
    """A micro-batch's real tokens in rows, and where each came from."""

    input_ids: torch.Tensor
    """``[rows, L]`` token ids (pad 0 after each row's last sample)."""
    position_ids: torch.Tensor
    """``[rows, L]`` positions restarting at 0 per sample (0 on the row tails)."""
    packed_index: torch.Tensor
    """Flat ``rows * L`` index of each real token."""
    padded_index: torch.Tensor
    """Flat ``B * S`` index of the same token in the padded layout."""
    padded_shape: tuple[int, int]
    host_index: tuple[torch.Tensor, torch.Tensor] = field(repr=False)
    """``(packed_index, padded_index)`` on the host, for :meth:`response_slots`."""

    def host_positions(self, position_ids: torch.Tensor) -> torch.Tensor:
        """:attr:`position_ids` computed on the host from the padded ``position_ids``' host copy (the same values;
        ``repro.workers.varlen.host_boundaries`` reads the rows' sample boundaries from them without a device wait)."""
        packed_host, padded_host = self.host_index
        out = torch.zeros(self.input_ids.numel(), dtype=position_ids.dtype)
        out[packed_host] = position_ids.reshape(-1)[padded_host]
        return out.view(self.input_ids.shape)

    @property
    def next_token(self) -> torch.Tensor:
        """``[rows, L]`` the token each position predicts (its right neighbour in the row)."""
        return torch.nn.functional.pad(self.input_ids[:, 1:], (0, 1))

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """``[rows, L]`` per-token values -> ``[B, S]`` in the padded layout, 0 on padding (differentiable)."""
        out = values.new_zeros(self.padded_shape[0] * self.padded_shape[1])
        out = out.index_put((self.padded_index,), values.reshape(-1).index_select(0, self.packed_index))
        return out.view(self.padded_shape)

    def response_slots(self, response_mask: torch.Tensor) -> ResponseSlots:
        """Where the logits predicting each response token (``response_mask`` ``[B, R]``, the last
        ``R`` padded columns) lie in the packed rows."""
        batch, seq = self.padded_shape
        resp = response_mask.shape[1]
        width = self.input_ids.shape[1]
        packed_host, padded_host = self.host_index
        packed_of = torch.full((batch * seq,), -1, dtype=torch.long)
        packed_of[padded_host] = packed_host
        target = response_mask.detach().to("cpu").reshape(-1).nonzero().squeeze(-1)
        # response token t of sample i is predicted by padded position (i, S - R + t - 1)
        source = packed_of[(target // resp) * seq + (seq - resp) + target % resp - 1]
        if bool((source < 0).any()):
            raise ValueError("a response token follows a padding position (attention_mask 0 before it): "
                             "remove-padding needs real tokens before every response token")
        columns, column_of = torch.unique(source % width, return_inverse=True)
        dev = self.input_ids.device
        return ResponseSlots(columns=_to(columns, dev), row=_to(source // width, dev),
                             column_of=_to(column_of, dev), target=_to(target, dev), shape=(batch, resp))


@dataclass
class ResponseSlots:
    """The packed positions predicting response tokens, and where their values go in ``[B, R]``."""

    columns: torch.Tensor
    """Sorted packed columns that any row needs (``logits_to_keep``); one row needs no other."""
    row: torch.Tensor
    """Packed row of each response token's predicting position."""
    column_of: torch.Tensor
    """Its index into ``columns``."""
    target: torch.Tensor
    """Flat ``B * R`` index of the response token."""
    shape: tuple[int, int]

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        """``[rows, len(columns)]`` per-position values -> ``[B, R]``, 0 off the response mask (differentiable)."""
        picked = values[self.row, self.column_of]
        out = picked.new_zeros(self.shape[0] * self.shape[1]).index_put((self.target,), picked)
        return out.view(self.shape)


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
         capacity: int | None = None, *, one_row: bool = False) -> PackedBatch:
    """Pack the real tokens of a padded ``[B, S]`` micro-batch into first-fit rows of at most
    ``min(capacity, S)`` tokens, or all into one row."""
    batch, seq = attention_mask.shape
    mask = attention_mask.detach().to("cpu", torch.bool)
    lengths = mask.sum(dim=1).tolist()
    rows = first_fit(lengths, None if one_row else seq if capacity is None else min(capacity, seq))
    width = max([sum(lengths[i] for i in row) for row in rows] + [1])
    # where each sample starts in the flat rows * width layout, samples back to back in row order
    order, starts = [], []
    for r, row in enumerate(rows):
        col = r * width
        for i in row:
            order.append(i)
            starts.append(col)
            col += lengths[i]
    n = torch.tensor([lengths[i] for i in order], dtype=torch.long)
    total = sum(lengths)
    # token k of a sample lands at its start + k: arange(total) counts k from the sample's first token
    shift = torch.tensor(starts, dtype=torch.long) - (torch.cumsum(n, 0) - n)
    packed_host = torch.repeat_interleave(shift, n, output_size=total) + torch.arange(total)
    index = torch.tensor(order, dtype=torch.long)
    padded_host = (index[:, None] * seq + torch.arange(seq)).masked_select(mask[index])
    dev = input_ids.device
    packed_index, padded_index = _to(packed_host, dev), _to(padded_host, dev)
    ids = torch.zeros(len(rows) * width, dtype=input_ids.dtype, device=dev)
    pos = torch.zeros(len(rows) * width, dtype=position_ids.dtype, device=dev)
    ids[packed_index] = input_ids.reshape(-1)[padded_index]
    pos[packed_index] = position_ids.reshape(-1)[padded_index]
    return PackedBatch(
        input_ids=ids.view(len(rows), width), position_ids=pos.view(len(rows), width),
        packed_index=packed_index, padded_index=padded_index, padded_shape=(batch, seq),
        host_index=(packed_host, padded_host),
    )


def _to(index: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host index on ``device``, without waiting for the device (a no-op on the CPU)."""
    return index.to(device, non_blocking=True)
