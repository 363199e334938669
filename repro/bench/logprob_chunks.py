"""Time of the taken-token log-probs (forward + backward) per chunk size, next to the full fp32 ``log_softmax``.

:func:`repro.workers.logprob.token_log_probs` trades a bounded temporary for a Python loop over
chunks; this measures what each chunk size costs on one device, on ``[1, tokens, vocab]``
half-precision logits (the shape of a packed micro-batch's response positions), median of
``--repeats`` timed runs after one warm-up. Output: one TSV row per variant (milliseconds, peak
allocated GB above the logits and their gradient on CUDA).

    python -m repro.bench.logprob_chunks --tokens 1536 --vocab 151936           # GPU
    python -m repro.bench.logprob_chunks --tokens 64 --vocab 1000 --repeats 2   # CPU smoke run
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from repro.workers.logprob import token_log_probs


def _full(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def _time(fn, logits: torch.Tensor, labels: torch.Tensor, repeats: int) -> tuple[float, float]:
    cuda = logits.is_cuda
    times = []
    for i in range(repeats + 1):
        logits.grad = None
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        start = time.perf_counter()
        fn(logits, labels).sum().backward()
        if cuda:
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - start)
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30 if cuda else float("nan")
    return statistics.median(times) * 1e3, peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=1536)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--chunks", default="22,24,26", help="comma-separated log2 of chunk_elements")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(1, args.tokens, args.vocab, generator=gen, device=device, dtype=dtype).requires_grad_()
    labels = torch.randint(0, args.vocab, (1, args.tokens), generator=gen, device=device)
    variants = [("full_log_softmax", _full)]
    for log2 in (int(c) for c in args.chunks.split(",") if c):
        variants.append((f"chunk_2^{log2}", lambda x, y, n=1 << log2: token_log_probs(x, y, chunk_elements=n)[0]))
    print("variant\tms\tpeak_extra_gb")
    for name, fn in variants:
        ms, peak = _time(fn, logits, labels, args.repeats)
        print(f"{name}\t{ms:.2f}\t{peak:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
