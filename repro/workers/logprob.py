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

:data:`MODE` picks how a chunk runs. Eager, each chunk is a dozen of torch's kernels, most of them full passes over
an fp32 copy of the chunk: at the 0.6B shape's 151,936-entry vocabulary the log-probs of a 16k-response-token update
took 82 ms of GPU time, more than the LM head's matmul (``results/actor_update/README.md``, session 16). Compiled
(inductor, CUDA), a chunk's forward is one or two reductions that read the half-precision logits where they lie and
its backward one pointwise kernel writing the gradient in the logits' dtype: no fp32 copy of a chunk, so the chunks
can be twice as large (:data:`COMPILED_CHUNK_ELEMENTS`) for about the memory of an eager chunk. Both are the same
formulas in fp32, summed in another order.
"""

from __future__ import annotations

import os

import torch

from repro.workers.profiling import phase

MODES = ("auto", "compiled", "eager")
MODE = "auto"
"""``auto``: compiled on CUDA for half-precision logits unless dynamo is switched off (``TORCHDYNAMO_DISABLE=1``),
eager elsewhere, so the CPU path and its goldens stay exact; ``compiled`` or ``eager`` force either."""

BACKEND = "inductor"
"""The compiled path's torch.compile backend (the CPU test sets ``aot_eager``: traced, run by torch's kernels)."""

COMPILED_CHUNK_ELEMENTS = 1 << 25
"""Values of one compiled chunk (about 220 tokens of a 150k vocabulary): its temporaries live in registers, so its
memory is the gradient chunk's half-precision copy before it lands in the gradient (64 MiB) and, were inductor to
keep one, an fp32 chunk (128 MiB); an eager chunk keeps two or three fp32 chunks of 64 MiB."""

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
    """The chunks, eager (torch's kernels) or ``compiled`` (:func:`_compiled`): the same forward formulas; the
    backward's one-hot term is a scatter eager (the CPU goldens' arithmetic) and a comparison compiled."""

    @staticmethod
    def forward(ctx, logits, labels, temperature, with_entropy, chunk_elements, compiled):  # noqa: D102
        shape, acc = logits.shape[:2], _accumulation_dtype(logits)
        lse = torch.empty(shape, dtype=acc, device=logits.device)
        log_prob = torch.empty(shape, dtype=acc, device=logits.device)
        entropy = torch.empty(shape if with_entropy else (0,), dtype=acc, device=logits.device)
        chunk_forward = _compiled("forward") if compiled else _forward_math
        for rows, pos in _chunks(logits, chunk_elements):
            c_lse, c_lp, c_ent = chunk_forward(logits[rows, pos], labels[rows, pos], temperature, with_entropy)
            lse[rows, pos], log_prob[rows, pos] = c_lse, c_lp
            if with_entropy:
                entropy[rows, pos] = c_ent
        ctx.save_for_backward(logits, labels, lse)
        ctx.temperature, ctx.with_entropy, ctx.chunk_elements = temperature, with_entropy, chunk_elements
        ctx.compiled = compiled
        return log_prob, entropy

    @staticmethod
    def backward(ctx, grad_log_prob, grad_entropy):  # noqa: D102
        logits, labels, lse = ctx.saved_tensors
        if ctx.compiled:
            return _compiled_backward(ctx, logits, labels, lse, grad_log_prob, grad_entropy)
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
        return grad, None, None, None, None, None


def _forward_math(x: torch.Tensor, labels: torch.Tensor, temperature: float, with_entropy: bool):
    """(lse, log-prob, entropy) of one chunk, in the accumulation dtype: eager as it stands, compiled fused by
    inductor into reductions over the half-precision chunk."""
    x = _scaled(x, _accumulation_dtype(x), temperature)
    lse = torch.logsumexp(x, dim=-1)
    log_prob = x.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return lse, log_prob, lse.new_empty((0,))
    p = torch.exp(x - lse.unsqueeze(-1))
    return lse, log_prob, lse - (p * x).sum(-1)


def _backward_math(x: torch.Tensor, labels: torch.Tensor, lse: torch.Tensor, grad_log_prob: torch.Tensor,
                   grad_entropy: torch.Tensor, temperature: float, with_entropy: bool) -> torch.Tensor:
    """The chunk's gradient in the logits' dtype: one pointwise kernel (and one reduction with entropy), the
    one-hot term drawn by comparison instead of a scatter so that nothing is written twice."""
    out_dtype = x.dtype
    x = _scaled(x, _accumulation_dtype(x), temperature)
    p = torch.exp(x - lse.unsqueeze(-1))
    onehot = labels.unsqueeze(-1) == torch.arange(x.shape[-1], device=x.device)
    g = (onehot.to(x.dtype) - p) * grad_log_prob.unsqueeze(-1)
    if with_entropy:
        mean_x = (p * x).sum(-1, keepdim=True)
        g = g + grad_entropy.unsqueeze(-1) * p * (mean_x - x)
    return (g / temperature if temperature != 1.0 else g).to(out_dtype)


_COMPILED: dict[str, object] = {}


def _compiled(name: str):
    """The compiled math under :data:`BACKEND`, made once per process (dynamic shapes: chunks and micro-batches vary
    in length, and one graph serves them all)."""
    key = f"{name}:{BACKEND}"
    if key not in _COMPILED:
        fn = {"forward": _forward_math, "backward": _backward_math}[name]
        _COMPILED[key] = torch.compile(fn, backend=BACKEND, dynamic=True)
    return _COMPILED[key]


def compiled_for(logits: torch.Tensor) -> bool:
    """Whether :func:`token_log_probs` runs the compiled path for these logits (see :data:`MODE`)."""
    if MODE not in MODES:
        raise ValueError(f"repro.workers.logprob.MODE={MODE!r} is not valid; choose one of {list(MODES)}")
    if MODE != "auto":
        return MODE == "compiled"
    return (logits.is_cuda and logits.dtype in (torch.bfloat16, torch.float16)
            and os.environ.get("TORCHDYNAMO_DISABLE") != "1")


def _compiled_backward(ctx, logits, labels, lse, grad_log_prob, grad_entropy) -> tuple:
    """The compiled chunks' backward: each chunk's gradient one kernel, copied into the gradient."""
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
    glp = torch.zeros_like(lse) if grad_log_prob is None else grad_log_prob.float()
    use_entropy = ctx.with_entropy and grad_entropy is not None
    gent = grad_entropy.float() if use_entropy else lse  # unread without entropy: any tensor of lse's shape
    chunk_backward = _compiled("backward")
    for rows, pos in _chunks(logits, ctx.chunk_elements):
        grad[rows, pos] = chunk_backward(logits[rows, pos], labels[rows, pos], lse[rows, pos], glp[rows, pos],
                                         gent[rows, pos], ctx.temperature, use_entropy)
    return grad, None, None, None, None, None


def token_log_probs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_elements: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log softmax(logits / T)[labels]`` and, if asked, the entropy, both ``[B, T]`` (fp32 or wider).

    ``logits`` is ``[B, T, V]`` in any dtype and layout (a slice of the model output is fine);
    ``labels`` is ``[B, T]``. Differentiable in ``logits``. ``chunk_elements``: values a chunk (default
    :data:`CHUNK_ELEMENTS` eager, :data:`COMPILED_CHUNK_ELEMENTS` compiled).
    """
    if logits.dim() != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(f"token_log_probs needs logits [B, T, V] and labels [B, T]; got {tuple(logits.shape)} "
                         f"and {tuple(labels.shape)}")
    compiled = compiled_for(logits)
    if chunk_elements is None:
        chunk_elements = COMPILED_CHUNK_ELEMENTS if compiled else CHUNK_ELEMENTS
    with phase("logprob"):  # its backward is labelled through the forward op's sequence number
        log_prob, entropy = _TokenLogProb.apply(logits, labels.long(), float(temperature), bool(with_entropy),
                                                int(chunk_elements), compiled)
    return log_prob, (entropy if with_entropy else None)
