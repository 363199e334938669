"""One rank fails mid-update, on purpose: the fault the "every rank stops" tests inject.

``REPRO_FAULT_RANK=<rank>:<kind>:<update>`` makes rank ``<rank>`` fail in its ``<update>``-th actor
update (1-based), in the forward of the last micro-batch of that update's first mini-batch, while
its peers go on into the update's collectives and wait there for it. Kinds:

- ``forward``: the forward raises (``RuntimeError``), as a bug in one rank's model code would;
- ``data``: the rank's micro-batch gets a token id past the vocabulary, so the embedding itself
  raises (``IndexError``) on that rank only, as one rank's bad shard would;
- ``oom``: ``torch.OutOfMemoryError``, as the one rank whose batch is longest would meet it.

The check sits where both front doors train: ``repro.workers.engine.RoleEngine`` (``arm_fault`` at
the start of an actor update, the fault in its ``forward``). repro's trainer arms it from
``ActorWorker.update_policy`` (an update = one RL step's ``update_policy``); verl's trainer with
repro's engine (``model_engine=deepspeed``) from the engine's ``train_mode`` around each
``update_actor`` (``repro.integrations.verl.engine``). Either way the count of updates survives a
resume (it is in the checkpoints), and Ray's workers inherit the variable from the driver.

Unset (the default) it costs one environment lookup per update. Only the tests set it
(``tests/e2e/test_run_safety.py``, ``tests/verl_parity/engine/test_verl_trainer_faults.py``);
it is listed with the other variables in docs/config.md.
"""

from __future__ import annotations

import os

import torch

ENV = "REPRO_FAULT_RANK"
KINDS = ("forward", "data", "oom")


def planned(rank: int, update: int) -> str | None:
    """The fault kind this rank injects in this update (1-based), or None."""
    spec = os.environ.get(ENV, "")
    if not spec:
        return None
    try:
        at_rank, kind, at_update = spec.split(":")
        at = (int(at_rank), int(at_update))
    except ValueError:
        raise ValueError(f"{ENV}={spec!r} is not valid; write <rank>:<kind>:<update>, kind one of {list(KINDS)}") from None
    if kind not in KINDS:
        raise ValueError(f"{ENV}={spec!r}: kind {kind!r} is not valid; choose from {list(KINDS)}")
    return kind if at == (rank, update) else None


def inject(kind: str, input_ids: torch.Tensor, vocab_size: int, rank: int) -> torch.Tensor:
    """Fail as ``kind`` says (the message names ``rank``); ``data`` returns the corrupted ids for the
    real forward to fail on."""
    if kind == "forward":
        raise RuntimeError(f"injected fault ({ENV}): rank {rank}'s forward failed")
    if kind == "oom":
        raise torch.OutOfMemoryError(f"injected fault ({ENV}): out of memory in rank {rank}'s forward")
    bad = input_ids.clone(memory_format=torch.contiguous_format)
    bad.view(-1)[0] = vocab_size  # one id past the embedding table
    return bad
