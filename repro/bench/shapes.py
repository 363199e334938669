"""The benchmarks' model shapes: a shape's name to its Hugging Face config, and its randomly initialised model folder.

One place for the shapes that ``repro.bench.workers``, ``repro.bench.rmpad`` and the profile analysis
(:mod:`repro.bench.profile_phases`) name. Imports :mod:`repro.data.tiny_model` and :mod:`repro.bench.workdir`.
"""

from __future__ import annotations

from pathlib import Path

from repro.bench.workdir import save_once


def model_config(shape: str):
    """The Hugging Face config of a bench shape: ``qwen3-0.6b``, ``qwen3-0.6b-narrow`` or ``tiny``."""
    from repro.data.tiny_model import PolicyShape, qwen3_0p6b_config, tiny_config

    if shape == "qwen3-0.6b":
        return qwen3_0p6b_config()
    if shape == "qwen3-0.6b-narrow":  # same layers, norms, GQA ratio and vocabulary: the same ops, fewer FLOPs
        config = qwen3_0p6b_config()
        config.update({"hidden_size": 64, "head_dim": 16, "intermediate_size": 128, "num_attention_heads": 2,
                       "num_key_value_heads": 1})
        return config
    if shape == "tiny":
        return tiny_config(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                           shape=PolicyShape(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                                           max_position_embeddings=2048))
    raise ValueError(f"--shape={shape!r} is not valid; choose one of ['tiny', 'qwen3-0.6b', 'qwen3-0.6b-narrow']")


def make_model_dir(shape: str, out: Path) -> Path:
    """A randomly initialised model of ``shape`` saved as a Hugging Face folder (once, shared by invocations)."""
    def write(folder: Path) -> None:
        import torch

        from repro.data.tiny_model import build_model

        model = build_model(model_config(shape), seed=0, dtype=torch.bfloat16 if shape != "tiny" else torch.float32)
        model.save_pretrained(folder, safe_serialization=True)

    return save_once(out, write)
