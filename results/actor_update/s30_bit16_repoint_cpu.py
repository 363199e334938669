"""Session 30 (issue 35): what DeepSpeed's re-pointing of ZeRO-1/2's bf16 weights after every optimizer step costs the host.

``DeepSpeedZeroOptimizer.step`` ends with ``_update_model_bit16_weights`` per group ("TODO: we probably don't need
this? just to be safe"): every parameter's ``.data`` set again to its slice of the flat bf16 buffer, though the
all-gather wrote into that buffer in place. Session 29 counted it at 2,480 of the ZeRO-2 update's 12,921 host
operators (``results/seed_scale/README.md`` section 10). This times DeepSpeed's own method on the 0.6B shape's 310
tensors (a stand-in optimizer holding only the attributes it reads) against the cheapest exact guard (is every
parameter already its slice: pointer, shape, contiguity), with no dispatcher operators in the guard.

    OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu python results/actor_update/s30_bit16_repoint_cpu.py
"""

import time
from types import SimpleNamespace

import torch
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
from torch.profiler import profile

LAYER = [(2048, 1024), (1024, 1024), (1024, 1024), (1024, 2048), (128,), (128,), (3072, 1024), (3072, 1024),
         (1024, 3072), (1024,), (1024,)]  # q (16 heads x 128), k, v (8 x 128), o, q/k norms, gate, up, down, 2 norms
shapes = [(151936, 1024)] + LAYER * 28 + [(1024,)]  # tied embedding / LM head, 28 layers, final norm: 310 tensors
numels = [torch.Size(s).numel() for s in shapes]
flat = torch.zeros(sum(numels), dtype=torch.bfloat16)
offsets = [sum(numels[:k]) for k in range(len(numels))]
params = [torch.nn.Parameter(flat.narrow(0, o, n).view(s)) for o, n, s in zip(offsets, numels, shapes)]
opt = SimpleNamespace(bit16_groups_flat=[flat], round_robin_bit16_groups=[params], bit16_groups=[params],
                      round_robin_bit16_meta=[[torch.empty(s, device="meta") for s in shapes]],
                      round_robin_bit16_offsets=[offsets], round_robin_bit16_indices=[list(range(len(params)))])


def stock() -> None:
    DeepSpeedZeroOptimizer._update_model_bit16_weights(opt, 0)


def guard() -> bool:
    base, size = flat.data_ptr(), flat.element_size()
    return all(p.data_ptr() == base + o * size and p.shape == s and p.is_contiguous()
               for p, o, s in zip(params, offsets, shapes))


for fn in (stock, guard, stock, guard):
    t = time.perf_counter()
    for _ in range(200):
        fn()
    ms = (time.perf_counter() - t) / 200 * 1e3
    with profile() as prof:
        fn()
    ops = sum(1 for e in prof.events() if e.cpu_parent is None)
    print(f"{fn.__name__}: {len(params)} tensors, {ms:.3f} ms a call "
          f"(mean of 200), {ops} host operators")
assert guard(), "the parameters are their slices after DeepSpeed's re-pointing"
