"""The engine's ``save_checkpoint`` / ``load_checkpoint``: repro's checkpoint folder in a verified store.

verl hands the engine one folder per save (``.../global_step_N/actor``). That folder is a
:class:`repro.run.checkpoints.CheckpointStore` holding ``engine_step_N/``: DeepSpeed's files and
the per-rank RNG/state files written by ``repro.workers.checkpoint.save``, sealed by a manifest
(size and checksum of every file) written last. A load takes the newest committed step whose
files all match their manifest, and refuses (naming the bad files) when none does: a damaged or
half-written checkpoint is never loaded. verl's LR schedule (stepped by the caller, not
DeepSpeed) travels in the rank state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed as dist

from repro.run.checkpoints import CheckpointStore
from repro.workers import checkpoint
from repro.workers.engine import RoleEngine

STEP_FORMAT = "engine_step_{}"


def _store(local_path: str) -> CheckpointStore:
    return CheckpointStore(local_path, step_format=STEP_FORMAT)


def _on_rank0(fn: Any) -> Any:
    """``fn()`` on rank 0, its result (or its error, re-raised) on every rank."""
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", fn())
        except Exception as err:  # noqa: BLE001 - every rank must learn of it, not only rank 0
            box[0] = ("error", f"{type(err).__name__}: {err}")
    dist.broadcast_object_list(box, src=0)
    status, value = box[0]
    if status == "error":
        raise ValueError(value)
    return value


def save_engine(role: RoleEngine, local_path: str, step: int, digest_source: Any, updates: int = 0) -> str:
    """Save ``role`` as ``engine_step_<step>`` of the store at ``local_path`` (every rank calls); its
    folder. ``updates``: the engine's count of actor updates, restored by :func:`load_engine`."""
    store = _store(local_path)
    stage = _on_rank0(lambda: str(store.begin(step)))
    state: dict[str, Any] = {"updates": updates}
    if role.lr_scheduler is not None:
        state["lr_scheduler"] = role.lr_scheduler.state_dict()
    checkpoint.save(role, stage, step, extra={"global_step": step}, state=state, digest_source=digest_source)
    return _on_rank0(lambda: str(store.commit(step, zero_stage=role.ds.zero_stage)))


def load_engine(role: RoleEngine, local_path: str, digest_source: Any) -> tuple[int, int]:
    """Load the newest intact checkpoint of the store at ``local_path`` into ``role``; its step and
    the engine's count of actor updates saved with it."""

    def newest_intact() -> str:
        store = _store(local_path)
        latest = store.latest()
        if latest is None:
            raise FileNotFoundError(f"no committed checkpoint under {local_path} (no {STEP_FORMAT.format('N')} "
                                    "with a manifest)")
        folder, _ = latest
        problems = store.verify(Path(folder))
        if problems:
            raise ValueError(f"checkpoint {folder} does not match its manifest: {problems}")
        return str(folder)

    folder = _on_rank0(newest_intact)
    loaded = checkpoint.load(role, folder, digest_source=digest_source)
    if role.lr_scheduler is not None and "lr_scheduler" in loaded.state:
        role.lr_scheduler.load_state_dict(loaded.state["lr_scheduler"])
    return loaded.step, int(loaded.state.get("updates", 0))
