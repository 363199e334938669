"""What one packed attention call costs the host beside what it costs the GPU, per kernel set, at the update's shapes.

    python -m repro.bench.attention_calls --impls torch,fa4 --budget 32768   # one GPU; rmpad's form C batch

Why: on one H200, FlashAttention-4's kernels ran the 0.6B update's attention 1.4x faster than torch's FlashAttention-2,
and the profiled FA4 update left the GPU idle 3x longer (``results/actor_update/README.md``, session 26). FA4's kernels
are reached through Python (repro's glue, :mod:`repro.workers.fa4_kernels`, then FA4's own interface), FA2's through
C++: where issuing a call costs the host more than the call costs the GPU, the GPU waits. A profiler inflates host
time, so this bench measures it without one. Session 27 found FA4's calls dearer to the host (0.24-0.36 ms at a
27k-token micro-batch, 1.3-1.9x FA2's) but hidden there behind the layers' other GPU work; the update 1.07x faster.

How: the GPU is first held busy by a spin kernel (``torch.cuda._sleep``) long enough that the host issues every call of
a round before the spin ends, so the host never waits on the device: wall time over the issuing loop is the host's time
per call, and CUDA events queued before and after the calls time the device's work alone. A row whose spin ended before
the host finished issuing says so (``held`` false): its device time then includes idle, and the round should be rerun
with a longer ``--hold``.

The shapes are :mod:`repro.bench.rmpad`'s batch (the same arguments, the same seed) split by the token budget as the
worker splits it, each micro-batch packed into one row (``use_remove_padding``), at the shape's heads (16 query, 8 KV,
dim 128 for ``qwen3-0.6b``). The forward is :func:`repro.workers.varlen.packed` (the call every layer makes) with
gradients on, the backward ``torch.autograd.grad`` of its output (the varlen op's backward). Per micro-batch and
kernel set one TSV row per direction: host and device microseconds per call, and their ratio; the summary line adds
both over an update (every layer, forward and backward, every micro-batch).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

COLUMNS = ("impl", "kernels", "micro_batch", "tokens", "samples", "longest", "direction", "host_us", "device_us",
           "host_per_device", "held")


def _hold(seconds: float, cycles_per_s: float) -> None:
    import torch

    torch.cuda._sleep(int(seconds * cycles_per_s))


def _cycles_per_second() -> float:
    """The spin kernel's cycles per second on this GPU, timed once."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    torch.cuda._sleep(50_000_000)
    end.record()
    end.synchronize()
    return 50_000_000 / (start.elapsed_time(end) / 1e3)


def time_calls(call, calls: int, hold_s: float, cycles_per_s: float) -> tuple[float, float, bool]:
    """(host s per call, device s per call, held): ``calls`` calls issued behind a spin of ``hold_s`` seconds."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    _hold(hold_s, cycles_per_s)
    start.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    host = time.perf_counter() - t0
    held = not start.query()  # the GPU was still spinning when the last call was issued
    end.record()
    end.synchronize()
    return host / calls, start.elapsed_time(end) / 1e3 / calls, held


def micro_batches(args: argparse.Namespace, vocab: int) -> list[list[int]]:
    """The real lengths of each micro-batch of rmpad's batch under ``--budget`` (one rank, as the worker splits)."""
    from repro.batching.token_budget import split_micro_batches_by_tokens
    from repro.bench.rmpad import make_batch

    lengths = make_batch(args, vocab)["attention_mask"].sum(1).tolist()
    budget = args.budget or args.micro * (args.prompt + args.response)
    return [[lengths[i] for i in bin_] for bin_ in split_micro_batches_by_tokens(lengths, budget)]


def _select(impl: str) -> str:
    """``model.flash_attention=impl`` for this process; the kernels read back."""
    import torch

    from repro.workers import varlen

    # varlen.activate("torch") leaves kernels already active in place (process-wide: every role of a worker process
    # attends with one set); this bench measures both sets in one process, so it takes FA4's out itself
    if impl == "torch" and varlen.current_impl() != "torch":
        from torch.nn.attention import restore_flash_attention_impl

        restore_flash_attention_impl()
    return varlen.activate(impl, torch.bfloat16)


def _micro_batch_rows(args: argparse.Namespace, lengths: list[int], seed: int, heads: int, kv_heads: int, dim: int,
                      cycles_per_s: float) -> list[dict]:
    """The forward's and the backward's row of one packed micro-batch under the active kernels."""
    import torch

    from repro.workers import varlen

    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(sum(lengths), h, dim, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for h in (heads, kv_heads, kv_heads))

    def forward() -> torch.Tensor:
        return varlen.packed(q, k, v, cu, max(lengths), dim ** -0.5)

    out = forward()
    grad = torch.randn_like(out)

    def backward() -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)

    rows = []
    for direction, call in (("forward", forward), ("backward", backward)):
        for _ in range(args.warmup):  # the first calls compile FA4's kernels for this key
            call()
        host, device, held = time_calls(call, args.calls, args.hold, cycles_per_s)
        rows.append({"direction": direction, "host_us": host * 1e6, "device_us": device * 1e6,
                     "host_per_device": host / device, "held": held})
    return rows


def measure(args: argparse.Namespace) -> list[dict]:
    from repro.bench.shapes import model_config

    config = model_config(args.shape)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    cycles = _cycles_per_second()
    rows = []
    for impl in args.impls.split(","):
        kernels = _select(impl)
        for index, lengths in enumerate(micro_batches(args, config.vocab_size)):
            head = {"impl": impl, "kernels": kernels, "micro_batch": index, "tokens": sum(lengths),
                    "samples": len(lengths), "longest": max(lengths)}
            rows += [{**head, **r} for r in _micro_batch_rows(args, lengths, index, heads, kv_heads, dim, cycles)]
    return rows


def _cell(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, float) and value < 10 else (
        f"{value:.1f}" if isinstance(value, float) else str(value))


def summary(rows: list[dict], layers: int) -> list[str]:
    """Per kernel set: host and device milliseconds of an update's attention calls (every layer's forward and
    backward of every micro-batch)."""
    lines = []
    for impl in dict.fromkeys(r["impl"] for r in rows):
        mine = [r for r in rows if r["impl"] == impl]
        host = layers * sum(r["host_us"] for r in mine) / 1e3
        device = layers * sum(r["device_us"] for r in mine) / 1e3
        lines.append(f"# {impl} ({mine[0]['kernels']}): an update's attention calls ({layers} layers x "
                     f"{len(mine) // 2} micro-batches x forward and backward) issue in {host:.1f} ms of host time, run "
                     f"in {device:.1f} ms on the GPU; every round held: {all(r['held'] for r in mine)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="qwen3-0.6b")
    parser.add_argument("--impls", default="torch,fa4", help="comma-separated model.flash_attention values, in order")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--response", type=int, default=512)
    parser.add_argument("--min-response", type=int, default=1)
    parser.add_argument("--micro", type=int, default=16)
    parser.add_argument("--gas", type=int, default=4)
    parser.add_argument("--budget", type=int, default=32768, help="tokens per micro-batch (ppo_max_token_len_per_gpu)")
    parser.add_argument("--calls", type=int, default=50, help="calls per timed round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first (FA4 compiles on the first)")
    parser.add_argument("--hold", type=float, default=2.0, help="seconds the spin kernel holds the GPU per round")
    parser.add_argument("--out", default="", help="TSV of the rows")
    args = parser.parse_args(argv)
    from repro.config.fields import FLASH_ATTENTION
    from repro.devices import on_cpu

    bad = [i for i in args.impls.split(",") if i not in FLASH_ATTENTION]
    if bad:
        print(f"error: --impls {bad[0]!r} is not valid; choose from {list(FLASH_ATTENTION)}", file=sys.stderr)
        return 2
    if on_cpu():
        print("error: repro.bench.attention_calls times CUDA kernels; this process runs on CPU (no CUDA device, or "
              "DS_ACCELERATOR=cpu)", file=sys.stderr)
        return 2
    from repro.bench.shapes import model_config

    rows = measure(args)
    lines = ["\t".join(COLUMNS)] + ["\t".join(_cell(r[c]) for c in COLUMNS) for r in rows]
    print("\n".join(lines + summary(rows, model_config(args.shape).num_hidden_layers)), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
