"""torch.compile of the decoder layers: issue 35's experiment, set by the rmpad bench's ``rmpad_compiled`` case.

The actor update at the 0.6B shape is host-bound on an H100: the GPU idles 85% of a profiled step
(``results/actor_update/README.md``), and each of the 28 decoder layers dispatches about 330 operators an update
(forward, the checkpointed recompute, backward). Compiled, a layer's forward and backward become a few generated
kernels each. No config key sets this until a GPU run shows that it pays; the CPU suite proves that it changes no
value (``tests/distributed/workers/test_layer_compile.py``: backend ``aot_eager``, the same captured graphs run by
torch's own kernels, so the arithmetic is the eager one and the comparison bitwise).

Only where DeepSpeed leaves the layer's forward alone: ZeRO-1 and ZeRO-2. ZeRO-3 gathers each layer's parameters
in hooks on the module, which the compiled call would have to trace.

Imports: torch and ``repro.workers.zero3_leaf`` (the decoder layer class of a model).
"""

from __future__ import annotations

import os

import torch

from repro.workers.zero3_leaf import decoder_layer_classes


def refusal(zero_stage: int) -> str | None:
    """Why compiled decoder layers cannot be what was asked here, in one line; None when they can."""
    if zero_stage not in (0, 1, 2):
        return (f"compiled decoder layers: zero_stage={zero_stage} is not valid; choose 0, 1 or 2 "
                "(ZeRO-3's per-module gather hooks would be traced)")
    if os.environ.get("TORCHDYNAMO_DISABLE") == "1":
        # torch.compile reads it when called and then returns the function unchanged, without a word
        return "compiled decoder layers: TORCHDYNAMO_DISABLE=1 makes torch.compile do nothing; unset it"
    return None


def compile_decoder_layers(model: torch.nn.Module, zero_stage: int, backend: str = "inductor") -> int:
    """Compile every decoder layer of ``model`` in place (``nn.Module.compile``); how many were set to compile."""
    why = refusal(zero_stage)
    if why:
        raise ValueError(why)
    classes = tuple(decoder_layer_classes(model))
    layers = [m for m in model.modules() if classes and isinstance(m, classes)]
    for layer in layers:
        # dynamic shapes: token budgets give every micro-batch another length, and one graph serves them all
        layer.compile(backend=backend, dynamic=True)
    return len(layers)


def captured_graphs() -> int:
    """Graphs dynamo has captured in this process since its last reset: what ran compiled, not what was asked."""
    import sys

    if "torch._dynamo" not in sys.modules:  # never imported: nothing was compiled (and no import is paid to say so)
        return 0
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
