"""Which linear a ZeRO-3 engine runs: DeepSpeed's process-wide replacement of ``torch.nn.functional.linear``, or torch's.

At ZeRO-3, DeepSpeed 0.19.8's ``zero.Init`` (which ``deepspeed.initialize`` runs on the model) replaces
``torch.nn.functional.linear`` for the whole process with ``zero3_linear_wrap``
(``deepspeed/runtime/zero/partition_parameters.py``, when ``zero_optimization.memory_efficient_linear`` is on, its
default): a Python autograd function per linear call that saves the parameter, not the gathered weight, for the
backward. The replacement persists after the engine and reaches every model of the process (the reference
model, an in-process rollout). With ``deepspeed.memory_efficient_linear=false`` DeepSpeed skips it, but a ZeRO-3
engine built earlier in the process may have made it: :func:`keep_torch_linear` undoes it, from DeepSpeed's own
backup of torch's function. Session 18's profile of a ZeRO-3 update put 155 ms of the GPU's idle time in that
function and its backward (``results/actor_update/README.md``). Imports torch and DeepSpeed only.
"""

from __future__ import annotations

import torch


def _deepspeed_wrap():
    from deepspeed.runtime.zero.linear import zero3_linear_wrap

    return zero3_linear_wrap


def linear_in_use() -> str:
    """``deepspeed`` when ``torch.nn.functional.linear`` is DeepSpeed's ZeRO-3 function, else ``torch``."""
    return "deepspeed" if torch.nn.functional.linear is _deepspeed_wrap() else "torch"


def keep_torch_linear() -> None:
    """Put torch's ``linear`` back where DeepSpeed replaced it (no-op otherwise)."""
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses as Init

    if linear_in_use() == "deepspeed":
        torch.nn.functional.linear = Init.linear_bk
