"""ZeRO-3 leaf modules: the decoder layer class of a Hugging Face model, fetched as one unit.

Stock ZeRO-3 registers a fetch/release hook on every submodule, so a decoder layer costs a dozen
small all-gathers and hook round trips per forward and again per backward. Marking the decoder
layer class as a leaf (``deepspeed.utils.set_z3_leaf_modules``) gathers each layer's parameters in
one fetch. Measured on 2x H200 at the Qwen3-0.6B shape (issue 15): 2.3x stock ZeRO-3, level with
FSDP2. The class comes from the model itself: Hugging Face lists the block that must not be split
across devices in ``_no_split_modules`` (``Qwen3DecoderLayer`` for Qwen3), which is the decoder
layer. The update is unchanged (``tests/distributed/workers/test_zero_parity.py`` at ZeRO-3).
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch


def decoder_layer_classes(model: torch.nn.Module) -> list[type]:
    """The classes of ``model``'s submodules named in its ``_no_split_modules``."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    return sorted({type(m) for m in model.modules() if type(m).__name__ in names}, key=lambda c: c.__name__)


def use_leaves(zero_stage: int, enabled: bool, lora: bool) -> bool:
    """Whether a role fetches its decoder layers as ZeRO-3 leaf modules (the plan and the engine ask).

    Not a LoRA model: with its decoder layers as leaves, the stage-3 backward fails on DeepSpeed
    0.19.8 (a 0-size gradient against the adapters' shapes; tests/distributed/workers/test_lora.py
    at stage 3), so it keeps DeepSpeed's per-submodule hooks.
    """
    return zero_stage == 3 and enabled and not lora


def mark_zero3_leaves(model: torch.nn.Module) -> list[str]:
    """Mark the decoder layers as ZeRO-3 leaf modules (before ``deepspeed.initialize``); their names."""
    classes = decoder_layer_classes(model)
    if classes:
        from deepspeed.utils import set_z3_leaf_modules

        set_z3_leaf_modules(model, classes)
    return [c.__name__ for c in classes]


def leaf_names_for_path(path: str) -> list[str] | None:
    """The leaf class names a model folder would get, without loading weights (for the plan).

    ``tiny`` is the built-in Qwen3 policy; None when the folder or its architecture is unknown.
    """
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if path == "tiny":
        model_type = "qwen3"
    else:
        config = os.path.join(path, "config.json")
        if not os.path.isfile(config):
            return None
        with open(config) as f:
            model_type = json.load(f).get("model_type")
    cls: Any = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type, ""), None)
    names = getattr(cls, "_no_split_modules", None) if cls is not None else None
    return sorted(names) if names else None
