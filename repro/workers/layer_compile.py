"""torch.compile of the decoder layers: ``model.compile_layers`` (and the rmpad bench's ``rmpad_compiled`` case).

The actor update at the 0.6B shape is host-bound on an H100: the GPU idles 85% of a profiled step
(``results/actor_update/README.md``), and each of the 28 decoder layers dispatches about 330 operators an update
(forward, the checkpointed recompute, backward). Compiled, a layer's forward and backward become a few generated
kernels each. On one H100 it paid once checkpointing was off (1.18x, session 16 of that page), not under
checkpointing (session 15); hence a key, off by default. The CPU suite proves that it changes no
value (``tests/distributed/workers/test_layer_compile.py``: backend ``aot_eager``, the same captured graphs run by
torch's own kernels, so the arithmetic is the eager one and the comparison bitwise).

``model.compile_scope=stack`` compiles the module that holds the layers instead (the transformers base model:
embeddings, every layer, the final norm), one region a forward: session 34 sampled the layers' host cost on one H100
at 0.63 ms a layer call forward and 0.82 backward, mostly the wrappers around the generated code, paid once a layer.

Only where DeepSpeed leaves the layer's forward alone: ZeRO-1 and ZeRO-2. ZeRO-3 gathers each layer's parameters
in hooks on the module, which the compiled call would have to trace.

Imports: torch, ``repro.config.rules`` (the one refusal, which the config's validation also gives before any
worker starts) and ``repro.workers.zero3_leaf`` (the decoder layer class of a model).
"""

from __future__ import annotations

from typing import Any

import torch

from repro.config.rules import compile_refusal
from repro.workers.zero3_leaf import decoder_layer_classes


def compile_decoder_layers(model: torch.nn.Module, zero_stage: int, backend: str = "inductor",
                           scope: str = "layer") -> int:
    """Compile ``model``'s decoder layers in place (``nn.Module.compile``): each layer (``scope`` ``layer``), or each
    module that holds the layers in a ``ModuleList`` (``stack``: a transformers base model, its embeddings, rotary
    table and final norm with them); how many modules were set to compile."""
    why = compile_refusal(zero_stage)
    if why:
        raise ValueError(f"compiled decoder layers: {why}")
    classes = tuple(decoder_layer_classes(model))
    if not classes:
        return 0
    targets = _stacks(model, classes) if scope == "stack" else [m for m in model.modules() if isinstance(m, classes)]
    for module in targets:
        # dynamic shapes: token budgets give every micro-batch another length, and one graph serves them all
        module.compile(backend=backend, dynamic=True)
    return len(targets)


def _stacks(model: torch.nn.Module, classes: tuple[type, ...]) -> list[torch.nn.Module]:
    """The modules with a ``ModuleList`` child of decoder layers (the base model under a causal-LM head or peft)."""
    return [m for m in model.modules()
            if any(isinstance(c, torch.nn.ModuleList) and len(c) and all(isinstance(x, classes) for x in c)
                   for c in m.children())]


def from_config(model: torch.nn.Module, compile_layers: str, zero_stage: int, scope: str = "layer") -> int:
    """``model.compile_layers`` and ``model.compile_scope`` applied: the modules compiled (0 when ``off``)."""
    return 0 if compile_layers == "off" else compile_decoder_layers(model, zero_stage, compile_layers, scope)


def compiled_layers(model: torch.nn.Module) -> int:
    """Modules of ``model`` whose calls run compiled (``nn.Module.compile`` set them): the engine's read-back."""
    return sum(1 for m in model.modules() if getattr(m, "_compiled_call_impl", None) is not None)


def _dynamo_counters() -> Any:
    """Dynamo's counters, or None where it was never imported (nothing was compiled, and no import is paid to say so)."""
    import sys

    if "torch._dynamo" not in sys.modules:
        return None
    from torch._dynamo.utils import counters

    return counters


def captured_graphs() -> int:
    """Graphs dynamo has captured in this process since its last reset: what ran compiled, not what was asked."""
    counters = _dynamo_counters()
    return 0 if counters is None else int(counters["stats"]["unique_graphs"])


def graph_breaks() -> int:
    """Graph breaks dynamo has met in this process since its last reset: each splits a compiled function where the
    trace stopped (a host round-trip and one graph more a call), as the varlen path's boundary computation did inside
    the compiled layers before session 28's mend (``results/actor_update/README.md``, session 30);
    ``TORCH_LOGS=graph_breaks`` says where."""
    counters = _dynamo_counters()
    return 0 if counters is None else int(sum(counters["graph_break"].values()))
