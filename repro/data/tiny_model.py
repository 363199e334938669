"""Qwen3-architecture models built from configs (no hub downloads).

- ``tiny_config``: the tiny policy (hidden 128, 4 layers, 4 heads, 2 KV heads, intermediate
  512, ~0.99 M parameters with the character vocabulary) that learns the arithmetic task on CPU.
- ``toy_qwen3_config``: a smaller toy Qwen3 (vocab 64, hidden 32, 2 layers, ~21 k parameters)
  for distributed tests and scenarios where only real parameters of several shapes matter.
- ``qwen3_0p6b_config``: the *shape* of Qwen/Qwen3-0.6B, randomly initialised, for GPU
  throughput and memory benchmarks where only the shape matters.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

# transformers' config and model classes are imported where they are used: a job's driver needs
# only PolicyShape (the tiny policy's cache key), and the model classes cost ~1.5 CPU s to import.
if TYPE_CHECKING:
    from transformers import PreTrainedModel, Qwen3Config


@dataclass(frozen=True)
class PolicyShape:
    """Size knobs of a built-in Qwen3 policy (the tiny one by default, ``QWEN3_0P6B_SHAPE`` at the seed's scale)."""

    hidden_size: int = 128
    """Model width."""
    num_hidden_layers: int = 4
    """Decoder layers."""
    num_attention_heads: int = 4
    """Query heads; ``hidden_size`` must divide evenly by it."""
    num_key_value_heads: int = 2
    """KV heads (grouped-query attention); must divide ``num_attention_heads``."""
    intermediate_size: int = 512
    """MLP width."""
    max_position_embeddings: int = 512
    """Longest sequence the RoPE tables are sized for."""
    head_dim: int | None = None
    """Per-head width; None: ``hidden_size // num_attention_heads``."""
    vocab_size: int | None = None
    """Embedding rows; None: the tokenizer's size. Qwen3's 151,936 makes the LM head and the
    log-probs cost what they cost in the real model, whatever part of it the tokenizer uses."""

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value is not None and value < 1:
                raise ValueError(f"PolicyShape.{name}={value} must be >= 1")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"PolicyShape.hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"PolicyShape.num_attention_heads={self.num_attention_heads} is not divisible by "
                f"num_key_value_heads={self.num_key_value_heads}"
            )


def tiny_config(vocab_size: int, pad_token_id: int, bos_token_id: int, eos_token_id: int,
                shape: PolicyShape | None = None) -> Qwen3Config:
    """Config of the tiny policy for a tokenizer with these ids."""
    from transformers import Qwen3Config

    shape = shape or PolicyShape()
    if shape.vocab_size is not None and shape.vocab_size < vocab_size:
        raise ValueError(f"PolicyShape.vocab_size={shape.vocab_size} is smaller than the tokenizer's {vocab_size} ids")
    return Qwen3Config(
        vocab_size=shape.vocab_size or vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim or shape.hidden_size // shape.num_attention_heads,
        max_position_embeddings=shape.max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
    )


QWEN3_0P6B_SHAPE = PolicyShape(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                               intermediate_size=3072, max_position_embeddings=40960, head_dim=128,
                               vocab_size=151936)
"""Qwen/Qwen3-0.6B's architecture (its published config.json) for a policy built from a seed."""

TOY_VOCAB = 64
"""Vocabulary size of ``toy_qwen3_config`` (token ids ``0..TOY_VOCAB-1``; 0 is padding)."""


def toy_qwen3_config(**overrides: Any) -> Qwen3Config:
    """The toy Qwen3 of the distributed tests; ``overrides`` are ``Qwen3Config`` keyword arguments."""
    from transformers import Qwen3Config

    kwargs: dict[str, Any] = {
        "vocab_size": TOY_VOCAB,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "tie_word_embeddings": True,
        "pad_token_id": 0,
    }
    kwargs.update(overrides)
    return Qwen3Config(**kwargs)


def qwen3_0p6b_config() -> Qwen3Config:
    """The architecture of Qwen/Qwen3-0.6B (values from its published config.json)."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
    )


def build_model(config: Qwen3Config, seed: int = 0, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> PreTrainedModel:
    """A randomly initialised causal LM for ``config``; the same seed gives the same weights.

    ``device="meta"`` builds the module structure without memory (for counting parameters).
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def num_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def save_model(model: PreTrainedModel, out_dir: str | os.PathLike[str]) -> Path:
    """``save_pretrained`` in safetensors; the folder loads with ``AutoModelForCausalLM``."""
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    return out


def load_model(path: str | os.PathLike[str], dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """Load a Hugging Face model folder (the tiny policy or a real checkpoint)."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"model path {path} has no config.json; expected a Hugging Face model folder")
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
