"""Log-probs and entropy of the taken tokens, computed in chunks of the vocabulary-wide logits.

``log_softmax(logits.float())`` over a whole micro-batch allocates ``tokens * vocab * 4`` bytes
(twice more in backward: the saved softmax and its gradient), which for a 150k vocabulary is the
largest allocation of an RL update. :func:`token_log_probs` walks the logits in chunks of at most
``chunk_elements`` values: the forward keeps only one fp32 log-sum-exp per token, and the
backward recomputes the softmax chunk by chunk, writing the gradient straight into one buffer
of the logits' own dtype (which any backward of the logits needs). Temperature is folded into
the chunks, so no divided copy of the logits exists either. Entropy is computed in the same
pass only when asked for.

Gradients (``x = logits / T``, ``p = softmax(x)``, ``lse = logsumexp(x)``):
``d log p_y / dx = onehot(y) - p`` and ``d H / dx = p * (E_p[x] - x)``, each divided by ``T``.
"""

from __future__ import annotations

import torch

from repro.workers.profiling import phase

CHUNK_ELEMENTS = 1 << 24
"""Values of one fp32 chunk (64 MiB; about 110 tokens of a 150k vocabulary): bounds the
temporaries whatever the vocabulary size. Smaller chunks cost time on a GPU: each chunk is a
dozen kernel launches (``python -m repro.bench.logprob_chunks`` measures the choice)."""


def _chunks(logits: torch.Tensor, chunk_elements: int):
    """``(rows, positions)`` slices of ``[B, T, V]`` logits with at most ``chunk_elements`` values each.

    Whole sequences are grouped when one fits (short RL responses, small vocabularies: a chunk per
    sequence would be a dozen launches per sample, which a launch-bound GPU step measured as most of
    its log-prob time); a longer sequence is cut along its positions. Slices of the first two
    dimensions only, so a strided ``logits`` is never copied whole.
    """
    b, t, v = logits.shape
    per_sequence = max(1, t * v)
    if per_sequence <= chunk_elements:
        rows = chunk_elements // per_sequence
        for start in range(0, b, rows):
            yield slice(start, min(start + rows, b)), slice(0, t)
        return
    positions = max(1, chunk_elements // max(1, v))
    for row in range(b):
        for start in range(0, t, positions):
            yield slice(row, row + 1), slice(start, min(start + positions, t))


def _accumulation_dtype(logits: torch.Tensor) -> torch.dtype:
    """fp32 for half-precision logits, else the logits' own dtype (fp64 stays exact in tests)."""
    return torch.promote_types(logits.dtype, torch.float32)


def _scaled(chunk: torch.Tensor, dtype: torch.dtype, temperature: float) -> torch.Tensor:
    """``chunk / T`` in ``dtype`` (no division pass at T = 1)."""
    x = chunk.to(dtype)
    return x / temperature if temperature != 1.0 else x


class _TokenLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, temperature, with_entropy, chunk_elements):  # noqa: D102
        shape, acc = logits.shape[:2], _accumulation_dtype(logits)
        lse = torch.empty(shape, dtype=acc, device=logits.device)
        log_prob = torch.empty(shape, dtype=acc, device=logits.device)
        entropy = torch.empty(shape if with_entropy else (0,), dtype=acc, device=logits.device)
        for rows, pos in _chunks(logits, chunk_elements):
            x = _scaled(logits[rows, pos], acc, temperature)
            chunk_lse = torch.logsumexp(x, dim=-1)
            lse[rows, pos] = chunk_lse
            log_prob[rows, pos] = x.gather(-1, labels[rows, pos].unsqueeze(-1)).squeeze(-1) - chunk_lse
            if with_entropy:
                p = torch.exp(x - chunk_lse.unsqueeze(-1))
                entropy[rows, pos] = chunk_lse - (p * x).sum(-1)
        ctx.save_for_backward(logits, labels, lse)
        ctx.temperature, ctx.with_entropy, ctx.chunk_elements = temperature, with_entropy, chunk_elements
        return log_prob, entropy

    @staticmethod
    def backward(ctx, grad_log_prob, grad_entropy):  # noqa: D102
        logits, labels, lse = ctx.saved_tensors
        t = ctx.temperature
        grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
        use_entropy = ctx.with_entropy and grad_entropy is not None
        for rows, pos in _chunks(logits, ctx.chunk_elements):
            x = _scaled(logits[rows, pos], lse.dtype, t)
            p = torch.exp(x - lse[rows, pos].unsqueeze(-1))
            if grad_log_prob is not None:
                glp = grad_log_prob[rows, pos].to(lse.dtype)
                g = -p * glp.unsqueeze(-1)
                g.scatter_add_(-1, labels[rows, pos].unsqueeze(-1), glp.unsqueeze(-1))
            else:
                g = torch.zeros_like(p)
            if use_entropy:
                mean_x = (p * x).sum(-1, keepdim=True)
                g += grad_entropy[rows, pos].to(lse.dtype).unsqueeze(-1) * p * (mean_x - x)
            grad[rows, pos] = (g / t if t != 1.0 else g).to(grad.dtype)
        return grad, None, None, None, None


def token_log_probs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(logits / T)[labels]`` and, if asked, the entropy, both ``[B, T]`` (fp32 or wider).

    ``logits`` is ``[B, T, V]`` in any dtype and layout (a slice of the model output is fine);
    ``labels`` is ``[B, T]``. Differentiable in ``logits``.
    """
    if logits.dim() != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(f"token_log_probs needs logits [B, T, V] and labels [B, T]; got {tuple(logits.shape)} "
                         f"and {tuple(labels.shape)}")
    with phase("logprob"):  # its backward is labelled through the forward op's sequence number
        log_prob, entropy = _TokenLogProb.apply(logits, labels.long(), float(temperature), bool(with_entropy),
                                                int(chunk_elements))
    return log_prob, (entropy if with_entropy else None)
