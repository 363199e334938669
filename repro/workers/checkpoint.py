"""One checkpoint of a trainable role in one folder: DeepSpeed's native files plus what an exact resume needs.

Layout of the folder a save is given::

    ds/ckpt/...         engine.save_checkpoint (model, optimizer, scheduler; every ZeRO stage)
    rank0_state.pt      per rank: python/numpy/torch RNG states, worker state, ``extra``
    meta.json           step, dp size, ZeRO stage, config digest (written last, by rank 0)
    huggingface/        with ``hf_model`` in ``checkpoint.save_contents``: ``export_hf`` of it

Step folders, the ``latest`` marker, manifests, verification and pruning belong to
``repro.run.checkpoints`` (the driver's job); this module only fills and reads one folder.
``checkpoint.save_contents`` / ``load_contents`` are checked in ``repro.config``: DeepSpeed
writes and reads model, optimizer (with the LR scheduler) and ``extra`` as one exact-resume
unit, so those three are required; ``hf_model`` adds a Hugging Face export to a save.
``export_hf`` writes a Hugging Face folder (safetensors) from any ZeRO stage; ``iter_full_weights``
yields gathered weights one tensor at a time (a collective at ZeRO-3). ``save_worker`` /
``load_worker`` are the actor's and critic's save/resume (their update counter travels along).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

from repro.devices import on_cpu
from repro.run.checkpoints import write_json_atomic
from repro.workers import lora
from repro.workers.zero3_persist_gather import gathered

if TYPE_CHECKING:
    from repro.workers.engine import RoleEngine

logger = logging.getLogger(__name__)

DS_TAG = "ckpt"
META = "meta.json"
HF_DIR = "huggingface"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                    "merges.txt", "tokenizer.model", "added_tokens.json", "chat_template.jinja",
                    "generation_config.json")


class TrainableWorker(Protocol):
    """What ``save_worker``/``load_worker`` need of a worker (the actor and the critic)."""

    cfg: Any
    engine: RoleEngine
    updates: int


@dataclass
class Loaded:
    """What ``load`` restored besides the engine: the caller's ``extra`` and worker state."""

    path: str
    step: int
    extra: dict
    state: dict


def config_digest(cfg: Any) -> str:
    """Stable digest of a run config (dataclass tree) to tell a resume whether the config changed."""
    data = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else cfg
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    # A CPU run (DS_ACCELERATOR=cpu) on a GPU host neither uses nor should wake the CUDA generator.
    if not on_cpu():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and not on_cpu():
        torch.cuda.set_rng_state(state["cuda"])


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def save(engine: RoleEngine, path: str, step: int, extra: dict, *, state: dict | None = None,
         digest_source: Any = None) -> str:
    """Save a checkpoint of ``engine`` into the folder ``path`` (every rank calls it); returns ``path``."""
    assert engine.trainable and engine.engine is not None, "only trainable roles save checkpoints"
    folder = Path(path)
    if _rank() == 0:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / META).unlink(missing_ok=True)  # an overwritten folder is incomplete until the end
    _barrier()
    # A LoRA actor's frozen base is the model folder's: the checkpoint holds the adapters only.
    engine.engine.save_checkpoint(str(folder / "ds"), tag=DS_TAG, client_state={}, save_latest=False,
                                  exclude_frozen_parameters=lora.is_lora(engine.module))
    payload = {"rng": _rng_state(), "state": state or {}, "extra": extra, "step": step}
    rank_file = folder / f"rank{_rank()}_state.pt"
    torch.save(payload, str(rank_file) + ".tmp")
    os.replace(str(rank_file) + ".tmp", rank_file)
    _barrier()
    if _rank() == 0:
        meta = {"step": step, "dp": _world(), "zero_stage": engine.ds.zero_stage,
                "config_digest": config_digest(digest_source) if digest_source is not None else None}
        write_json_atomic(folder / META, meta)
    _barrier()
    return str(folder)


def load(engine: RoleEngine, path: str, *, digest_source: Any = None) -> Loaded:
    """Load the checkpoint folder ``path`` into ``engine`` and restore this rank's RNG states."""
    p = Path(path)
    meta_file = p / META
    if not meta_file.is_file():
        raise ValueError(f"checkpoint {p} is missing or incomplete (no {meta_file.name}, which a save writes last)")
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"checkpoint {meta_file} is corrupt: {err}") from err
    if meta.get("dp") != _world():
        raise ValueError(
            f"checkpoint {p} was saved with dp={meta.get('dp')} data-parallel ranks but this run has "
            f"dp={_world()}; resume with the same number of ranks (DeepSpeed's partitioned optimizer "
            "states are per-rank; convert with DeepSpeed's universal checkpoint tools to change dp)"
        )
    if meta.get("zero_stage") != engine.ds.zero_stage:
        raise ValueError(f"checkpoint {p} was saved at ZeRO-{meta.get('zero_stage')} but this run uses "
                         f"ZeRO-{engine.ds.zero_stage}; resume with the same deepspeed.zero_stage")
    if digest_source is not None and meta.get("config_digest") not in (None, config_digest(digest_source)):
        logger.warning("checkpoint %s was saved with a different config (digest %s)", p, meta.get("config_digest"))
    rank_file = p / f"rank{_rank()}_state.pt"
    try:
        loaded_path, _ = engine.engine.load_checkpoint(str(p / "ds"), tag=DS_TAG, load_optimizer_states=True,
                                                       load_lr_scheduler_states=True,
                                                       load_module_strict=not lora.is_lora(engine.module))
        payload = torch.load(rank_file, weights_only=False)
    except (OSError, RuntimeError, EOFError, KeyError, ValueError, AssertionError) as err:
        raise ValueError(f"checkpoint {p} could not be loaded ({type(err).__name__}: {err})") from err
    if loaded_path is None:
        raise ValueError(f"checkpoint {p / 'ds'} could not be loaded by DeepSpeed (files missing)")
    _set_rng_state(payload["rng"])
    engine.loaded_step = int(meta["step"])
    return Loaded(str(p), int(meta["step"]), payload.get("extra", {}), payload.get("state", {}))


# ---- weights ---------------------------------------------------------------------------------

def iter_full_weights(engine: RoleEngine) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of every parameter, full size, Hugging Face names, one at a time.

    At ZeRO-3 each parameter is all-gathered in turn (every rank must consume the whole
    iterator); below ZeRO-3 every rank already holds the full (training-dtype) parameters.
    """
    zero3 = engine.engine is not None and engine.ds.zero_stage == 3
    if lora.is_lora(engine.module):
        yield from lora.merged_weights(engine.module, zero3)
        return
    if not zero3:
        for name, param in engine.module.named_parameters():
            yield name, param.detach()
        return
    for name, param in engine.module.named_parameters():
        # the parameters ZeRO-3 keeps whole stay whole (the next forward need not gather them again)
        with gathered([param]):
            tensor = param.data.detach().clone()
        yield name, tensor


def export_hf(engine: RoleEngine, out_dir: str, *, tokenizer_dir: str | None = None) -> None:
    """Write a Hugging Face folder (config, safetensors, tokenizer) from any ZeRO stage (all ranks call)."""
    state = {}
    for name, tensor in iter_full_weights(engine):
        if _rank() == 0:
            state[name] = tensor.to("cpu", copy=True)
    if _rank() == 0:
        out = Path(out_dir)
        tmp = out.with_name(out.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        lora.base_model(engine.module).save_pretrained(str(tmp), state_dict=state, safe_serialization=True)
        if tokenizer_dir:
            for name in _TOKENIZER_FILES:
                src = Path(tokenizer_dir) / name
                if src.is_file() and not (tmp / name).exists():
                    shutil.copy2(src, tmp / name)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    _barrier()


def save_worker(worker: TrainableWorker, path: str, step: int, extra: dict, *, model: Any,
                contents: list[str]) -> str:
    """``save`` of a worker's engine with its update counter; ``hf_model`` in ``contents`` adds an HF export."""
    out = save(worker.engine, path, step, extra, state={"updates": worker.updates}, digest_source=worker.cfg)
    if "hf_model" in contents:
        export_hf(worker.engine, os.path.join(path, HF_DIR), tokenizer_dir=tokenizer_dir(model))
    return out


def load_worker(worker: TrainableWorker, path: str) -> dict:
    """Load the checkpoint folder ``path`` into a worker; returns its ``extra``."""
    loaded = load(worker.engine, path, digest_source=worker.cfg)
    worker.updates = int(loaded.state.get("updates", 0))
    return loaded.extra


def tokenizer_dir(model: Any) -> str | None:
    """Where a role's tokenizer files are (``model`` is its ``*.model`` config section); None for a built-in policy."""
    from repro.data.policies import is_built_in

    return model.tokenizer_path or (None if is_built_in(model.path) else model.path)
