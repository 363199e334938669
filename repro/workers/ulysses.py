"""Ulysses sequence parallelism (``ulysses_sequence_parallel_size = sp > 1``) with DeepSpeed's
``UlyssesSPAttentionHF``.

Layout: DeepSpeed's ``parallel_state_sp`` groups consecutive ranks into SP groups (``[0, 1]``,
``[2, 3]`` at sp=2 on 4 ranks); the ranks of a group form one data-parallel rank. The driver
still hands every rank its own share of the batch; :func:`gather_rows` joins the shares of an SP
group, so that every rank of the group sees the same samples and micro-batches (the group's
data-parallel shard), and :func:`own_rows` gives each rank back its share of the outputs.

Each micro-batch's sequences (padded, or packed rows with ``use_remove_padding``) are padded to
a multiple of sp and each rank keeps its slice (:func:`shard_sequence`); inside every attention
layer DeepSpeed's all-to-all swaps the sequence split for a head split and back. Per-token
outputs (log-probs, values) are gathered back along the sequence by :func:`gather_sequence`,
whose backward keeps the rank's own slice of the gradient: every rank computes the same loss
from the gathered tensor, so each rank's parameter gradient is the part that flows through its
own tokens, and DeepSpeed's SP-aware reduction sums those parts over the group.

Two things differ from ``UlyssesSPAttentionHF.register_with_transformers``:

- that helper drops the attention mask and replaces a core attention key process-wide
  (``ALL_ATTENTION_FUNCTIONS["sdpa"]``), so the rollout copy in the same process would go
  through the all-to-all too. :func:`enable` registers the wrapper under a key of its own
  (``repro_ulysses_<role>``) and sets it on that role's model only;
- plain causal attention over the gathered sequence is wrong for left padding and packed rows
  (the mask is gone): the core attention attends within the blocks that the gathered
  ``position_ids`` delimit (a block starts wherever the position does not grow by one), which is
  exactly the padded batch's attention for every real token. On CUDA in half precision that is
  :mod:`repro.workers.varlen`'s FlashAttention over the blocks (memory linear in the sequence);
  elsewhere SDPA with the block-causal mask built out (``[L, L]`` per sample: the exact CPU path).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from repro.batching.batch import Batch, to_device, with_host_copies
from repro.workers import varlen


def _block_causal_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """SDPA with a causal mask restricted to the blocks that the (gathered) position_ids delimit."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    pos = kwargs.pop("position_ids")
    kwargs.pop("is_causal", None)
    starts = torch.ones_like(pos, dtype=torch.bool)
    starts[:, 1:] = (pos[:, 1:] - pos[:, :-1]) != 1
    block = starts.cumsum(dim=-1)
    length = pos.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=pos.device).tril()
    mask = (block[:, :, None] == block[:, None, :]) & causal
    return sdpa_attention_forward(module, query, key, value, mask[:, None], is_causal=False, **kwargs)


def _core_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention within the gathered sequence's blocks: FlashAttention over them where the varlen
    path runs (the mask alone would be ``L^2`` per sample: 16 GB at 128k tokens), else the mask."""
    if varlen.supported(query.dtype):
        # DeepSpeed gathers the positions anew in every layer, so the boundaries (one host sync) are
        # computed per layer here (varlen's cache), not once per forward by the model's pre-hook as without SP.
        kwargs.pop("is_causal", None)
        return varlen.attention(module, query, key, value, None, **kwargs)
    return _block_causal_sdpa(module, query, key, value, attention_mask, **kwargs)


def enable(model: torch.nn.Module, sp: int, role: str) -> Any:
    """Put DeepSpeed's Ulysses attention on ``model`` (this role only); returns the ``mpu`` for
    ``deepspeed.initialize``. Every role with sp > 1 in a process must use the same sp."""
    from deepspeed.runtime.sequence_parallel import parallel_state_sp as mpu
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    from transformers import AttentionInterface

    if mpu._SEQUENCE_PARALLEL_GROUP is None:
        mpu.initialize_sequence_parallel(sequence_parallel_size=sp)
    elif mpu.get_sequence_parallel_world_size() != sp:
        raise ValueError(f"ulysses_sequence_parallel_size={sp} for {role}, but this process already uses "
                         f"sp={mpu.get_sequence_parallel_world_size()}; every role with sp > 1 needs the same sp")
    arch = model.config.get_text_config()
    heads = arch.num_attention_heads
    uattn = UlyssesSPAttentionHF(
        attn=_core_attention, batch_size=1, attn_head_count=heads,
        attn_head_size=getattr(arch, "head_dim", None) or arch.hidden_size // heads,
        kv_head_count=arch.num_key_value_heads, num_hidden_layers=arch.num_hidden_layers,
        process_group=mpu.get_sequence_parallel_group(), seq_length_is_variable=True,
    )

    def wrapper(module, query, key, value, attention_mask, *args, **kwargs):
        batch = query.shape[0]
        if uattn.batch_size != batch:
            # UlyssesSPAttentionHF fixes the micro-batch size at construction; ours varies
            # (token-budget micro-batches, packed rows).
            uattn.batch_size = batch
            for name in ("required_query_shape", "required_key_value_shape", "required_context_shape"):
                shape = list(getattr(uattn, name))
                setattr(uattn, name, torch.Size([shape[0], batch, *shape[2:]]))
        return uattn(module, query, key, value, None, *args, **kwargs)

    key = f"repro_ulysses_{role}"
    AttentionInterface.register(key, wrapper)
    # No mask function for the key: the wrapper ignores the local-length mask, and without one
    # transformers skips mask creation (and its packed-sequence scan, a device sync) entirely.
    model.set_attn_implementation(key)
    return mpu


def group() -> Any:
    from deepspeed.runtime.sequence_parallel import parallel_state_sp as mpu

    return mpu.get_sequence_parallel_group()


def gather_rows(batch: Batch, sp: int) -> Batch:
    """The SP group's shares of ``batch`` joined along the samples (rank order), on every rank."""
    g = group()
    out = {}
    for k, v in batch.items():
        if not torch.is_tensor(v) or v.dim() == 0:
            continue
        parts = [torch.empty_like(v) for _ in range(sp)]
        dist.all_gather(parts, v.contiguous(), group=g)
        out[k] = torch.cat(parts)
    return out


def rank_batch(batch: Batch, sp: int, device: torch.device) -> Batch:
    """What a rank computes on: ``batch`` on ``device``, with ``sp > 1`` its SP group's shares joined, and the host
    copies of its masks and positions (``repro.batching.batch.with_host_copies``; from the batch as it came where
    the rank's rows are its own, so that a host batch costs no copy)."""
    on_device = to_device(batch, device)
    if sp > 1:
        return with_host_copies(gather_rows(on_device, sp))
    return with_host_copies(on_device, source=batch)


def own_rows(tensor: torch.Tensor, sp: int) -> torch.Tensor:
    """This rank's share of a tensor over the SP group's samples."""
    rank = dist.get_rank(group())
    size = tensor.shape[0] // sp
    return tensor[rank * size:(rank + 1) * size]


def shard_sequence(input_ids: torch.Tensor, position_ids: torch.Tensor,
                   sp: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's slice of ``[b, S]`` ids, positions and next-token labels (S padded to a multiple
    of sp with token 0 at position 0: one-token blocks that no real token attends to)."""
    pad = -input_ids.shape[1] % sp
    ids = torch.nn.functional.pad(input_ids, (0, pad))
    pos = torch.nn.functional.pad(position_ids, (0, pad))
    labels = torch.nn.functional.pad(ids[:, 1:], (0, 1))
    width = ids.shape[1] // sp
    start = dist.get_rank(group()) * width
    # Contiguous: DeepSpeed's Ulysses attention all-gathers the positions, and NCCL refuses a strided
    # tensor ("Tensors must be contiguous") where gloo takes it; a slice of [b, S] with b > 1 is strided.
    return tuple(t[:, start:start + width].contiguous() for t in (ids, pos, labels))


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local: torch.Tensor, width: int) -> torch.Tensor:  # noqa: D102
        g = group()
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size(g))]
        dist.all_gather(parts, local.contiguous(), group=g)
        ctx.rank, ctx.local = dist.get_rank(g), local.shape[1]
        return torch.cat(parts, dim=1)[:, :width]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: D102
        start = ctx.rank * ctx.local
        own = torch.zeros((grad.shape[0], ctx.local, *grad.shape[2:]), dtype=grad.dtype, device=grad.device)
        keep = max(0, min(ctx.local, grad.shape[1] - start))
        own[:, :keep] = grad[:, start:start + keep]
        return own, None


def gather_sequence(local: torch.Tensor, width: int) -> torch.Tensor:
    """Per-token ``[b, S/sp]`` slices of the SP group -> ``[b, width]`` (differentiable, see module doc)."""
    return _GatherSequence.apply(local, width)


def token_forward(forward: Any, input_ids: torch.Tensor, position_ids: torch.Tensor, sp: int,
                  per_token: Any) -> tuple[torch.Tensor | None, ...]:
    """Forward ``[b, S]`` rows without an attention mask (padded rows or packed ones: the
    ``position_ids`` delimit the samples) and map the output to per-token tensors ``[b, S]``.

    ``per_token(output, labels)`` gets the model output and the next-token labels of the same
    positions and returns a tuple of ``[b, s]`` tensors (or None). With sp > 1 each rank runs its
    slice of the sequence and the results are gathered back to ``[b, S]`` on every rank.
    """
    width = input_ids.shape[1]
    if sp > 1:
        input_ids, position_ids, labels = shard_sequence(input_ids, position_ids, sp)
    else:
        labels = torch.nn.functional.pad(input_ids[:, 1:], (0, 1))
    outs = per_token(forward(input_ids=input_ids, position_ids=position_ids, use_cache=False), labels)
    if sp > 1:
        outs = tuple(None if o is None else gather_sequence(o, width) for o in outs)
    return outs
