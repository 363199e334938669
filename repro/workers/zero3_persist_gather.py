"""ZeRO-3's gather of the parameters it keeps whole, after each optimizer step: one coalesced all-gather.

DeepSpeed 0.19.8's stage-3 optimizer releases every parameter at the start of ``step()``, the persistent ones too
(``ds_persist``: those below ``stage3_param_persistence_threshold``), and gathers those back in ``_post_step``
through ``Init._all_gather`` -> ``_allgather_params_coalesced``, which despite its name launches one all-gather per
parameter (``deepspeed/runtime/zero/partition_parameters.py``). With the threshold at 1e7, which keeps all of the
Qwen3-0.6B shape's layer weights whole, that is 309 collectives after every step: session 20's GPU profile of one
micro-batch of 8 found 310 NCCL all-gathers and 160.7 ms of host time in ZeRO-3's ``step()`` against ZeRO-2's 57.4
(``results/actor_update/README.md``). :func:`coalesce` replaces that gather, on one optimizer, by the call DeepSpeed's
own forward prefetch makes, ``all_gather_coalesced``: one flat all-gather per dtype. An all-gather moves bytes, so a
run with it is bitwise the run without (``tests/distributed/workers/test_zero3_persist_gather.py``).

:func:`gathered` is how the rest of the workers read full parameters at ZeRO-3 (the rollout's weight sync, Hugging
Face exports, LoRA merges) without undoing that gather: DeepSpeed's ``GatheredParameters`` partitions every parameter
it was given on exit, the persistent ones too, so each weight sync left all of them sharded and the next forward
gathered them again (counted on 2 CPU ranks at the 0.6B shape's structure: one all-gather of the layers' 440M
elements and ~2,500 more host operators in the old-log-prob pass after each sync, ``results/seed_scale/README.md``
section 10).

Imports DeepSpeed only inside :func:`gathered`; the rest works on the optimizer object it is given
(``deepspeed.initialize``'s, at ZeRO-3).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

COALESCED = "coalesced"
PER_PARAMETER = "per_parameter"


def coalesce(optimizer: Any) -> None:
    """Make ``optimizer`` (DeepSpeed's ``DeepSpeedZeroOptimizer_Stage3``) gather its persistent parameters after a
    step in one coalesced all-gather. Its own ``_post_step`` still runs (timers, hpZ's secondary tensors), with
    the persistent list emptied for the call so that it skips its per-parameter gather."""
    original = optimizer._post_step

    def _post_step(timer_names: Any) -> None:
        persistent = optimizer.persistent_parameters
        optimizer.persistent_parameters = []
        try:
            original(timer_names)
        finally:
            optimizer.persistent_parameters = persistent
        if persistent:
            # Every rank holds the same list (DeepSpeed marks persistence from the model's sizes); the call sorts it
            # by ds_id before flattening, so the ranks' buffers line up.
            persistent[0].all_gather_coalesced(persistent).wait()

    _post_step.repro_coalesced = True  # type: ignore[attr-defined]
    optimizer._post_step = _post_step


def persistent_gather(optimizer: Any) -> str | None:
    """How ``optimizer`` gathers its persistent parameters after a step: :data:`COALESCED`, :data:`PER_PARAMETER`
    (DeepSpeed's own), or None when it is not a ZeRO-3 optimizer (a frozen ZeRO-3 role's engine holds DeepSpeed's
    ``DeepSpeedZeRoOffload``, which has persistent parameters but no step)."""
    if not hasattr(optimizer, "persistent_parameters") or not hasattr(optimizer, "_post_step"):
        return None
    return COALESCED if getattr(optimizer._post_step, "repro_coalesced", False) else PER_PARAMETER


@contextlib.contextmanager
def gathered(params: Sequence[Any]) -> Iterator[None]:
    """Inside, every ZeRO-3 parameter of ``params`` is whole on this rank; after it, those ZeRO-3 keeps whole
    (``ds_persist``) are still whole and the others partitioned again. A no-op for parameters that are not ZeRO-3's.

    Which parameters count as persistent is decided from the model's sizes alike on every rank (DeepSpeed's
    ``mark_persistent_parameters``), so every rank issues the same collectives here. A persistent parameter that
    something released is gathered back by DeepSpeed's own ``all_gather``, which gathers only the released ones
    (none, after a step) and, like every status change of ZeRO-3's, does so on every rank alike."""
    import deepspeed

    persistent = [p for p in params if getattr(p, "ds_persist", False)]
    if persistent:
        persistent[0].all_gather(param_list=persistent)
    with deepspeed.zero.GatheredParameters([p for p in params if not getattr(p, "ds_persist", False)],
                                           modifier_rank=None):
        yield
