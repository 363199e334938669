"""ZeRO-3's module hooks taken off the modules whose parameters it keeps whole.

DeepSpeed 0.19.8 hooks every module it registers (each module down to the leaves of
``repro.workers.zero3_leaf``) four times: before and after the forward (fetch and release the module's
parameters, record the prefetch trace) and, through two ``torch.autograd.Function`` wrappers of the module's
inputs and outputs, before and after its backward (``deepspeed/runtime/zero/parameter_offload.py``). A module
whose every parameter is persistent (``ds_persist``: below ``stage3_param_persistence_threshold``, never
released between optimizer steps) or that has none needs none of it: there is nothing to fetch or release.
With the threshold at 1e7 that is every module of the Qwen3-0.6B shape but the embedding (and the tied head),
and the hooks were the GPU's idle time at 2 micro-batches x GAS 4 (session 19's profile:
``BackwardHookFunctionBackward`` 97-108 ms and ``PostBackwardFunctionModuleBackward`` 61-65 ms a step;
``results/actor_update/README.md``). :func:`unhook` removes those modules' hooks; the root keeps its own
(DeepSpeed's step counter). A whole parameter that something released outside the step (a ``GatheredParameters``
exit) is still gathered before use: DeepSpeed's parameter dict gathers a released parameter when the module reads
it (``ZeROOrderedDict`` in the same file). The hooks compute nothing: the forward without them is bitwise the
forward with them; their autograd nodes only change the order in which autograd sums a tensor's gradient from its
consumers, so the gradients agree within that summation order's error
(``tests/distributed/workers/test_zero3_persist_hooks.py``).

Imports DeepSpeed only inside the functions: it works on the engine's parameter-offload object it is given.
"""

from __future__ import annotations

from typing import Any

import torch


def parameter_offload(engine: Any) -> Any:
    """The engine's ``DeepSpeedZeRoOffload`` (the one that holds the module hooks), or None below ZeRO-3: a
    trainable role's sits in its stage-3 optimizer, a frozen ZeRO-3 role's engine holds it as its optimizer."""
    optimizer = getattr(engine, "optimizer", None)
    offload = getattr(optimizer, "parameter_offload", optimizer)
    return offload if hasattr(offload, "forward_hooks") and hasattr(offload, "backward_hooks") else None


def _whole(module: torch.nn.Module) -> bool:
    """Whether DeepSpeed's hooks on ``module`` have nothing to fetch: the parameters they would fetch (its own;
    a leaf's whole subtree) are all persistent, and none is registered to it from another module."""
    from deepspeed.utils import z3_leaf_module

    if getattr(module, "_external_params", None):
        return False
    return all(getattr(p, "ds_persist", False) for p in module.parameters(recurse=z3_leaf_module(module)))


def unhook(engine: Any) -> int:
    """Remove DeepSpeed's ZeRO-3 module hooks from every module of ``engine`` but the root whose parameters all
    stay whole; return how many modules lost them. Call it once, after ``deepspeed.initialize`` and before the
    first forward (DeepSpeed records its prefetch trace from the hooks that fire)."""
    offload = parameter_offload(engine)
    if offload is None:
        return 0
    root = offload.module
    owner = {}
    for module in root.modules():
        owner[id(module._forward_pre_hooks)] = owner[id(module._forward_hooks)] = module
    removed: set[int] = set()
    for hooks in (offload.forward_hooks, offload.backward_hooks):
        kept = []
        for handle in hooks:
            module = owner.get(id(handle.hooks_dict_ref()))
            if module is not None and module is not root and _whole(module):
                handle.remove()
                removed.add(id(module))
            else:
                kept.append(handle)
        hooks[:] = kept
    return len(removed)


def hooked_modules(engine: Any) -> int | None:
    """How many modules of ``engine`` still carry DeepSpeed's ZeRO-3 fetch hook (the root counted); None below
    ZeRO-3. Read from the hooks' handles, not from the config."""
    offload = parameter_offload(engine)
    if offload is None:
        return None
    dicts = {id(h.hooks_dict_ref()) for h in offload.forward_hooks if h.hooks_dict_ref() is not None}
    return sum(1 for m in offload.module.modules() if id(m._forward_pre_hooks) in dicts)
