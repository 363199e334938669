"""Data for the RL runs: GSM8K and synthetic-arithmetic parquet files (verl's schema), the
character tokenizer, tiny Qwen3 models and the tiny policy's SFT warm start.

The heavy entry points are loaded on first use so that converting data does not import torch.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "ensure_tiny_policy": "repro.data.sft",
    "built_in": "repro.data.policies",
    "is_built_in": "repro.data.policies",
    "SFTRecipe": "repro.data.sft",
    "ensure_arith_parquet": "repro.data.arith",
    "PromptDataset": "repro.data.prompts",
    "render_prompt": "repro.data.prompts",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'repro.data' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
