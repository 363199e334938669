"""The built-in policies a run names instead of a model folder (``actor_rollout_ref.model.path=<name>``).

- ``tiny``: a 1 M-parameter Qwen3 warm-started by SFT on the arithmetic task; built on CPU in
  about 30 s, so CPU and GPU runs start from the same weights (``grpo_tiny``, ``ppo_tiny``).
- ``qwen3-0.6b-arith``: Qwen/Qwen3-0.6B's architecture (28 layers, hidden 1024, 16 query / 8 KV
  heads, head_dim 128, MLP 3072, tied embeddings, Qwen3's 151,936-entry vocabulary) from a seed,
  SFT'd on the same task in bf16 until its own held-out problems reach ``threshold``: the
  smallest policy at which the seed's run (Qwen3-0.6B GRPO on 2 GPUs) means something
  (``grpo_0p6b``). Built on a CUDA GPU in about a minute; real Qwen3 weights cannot be
  downloaded on the machines this suite proves itself on, and a random-init model scores 0.

Each is cached under ``$REPRO_CACHE_DIR/<name>/<recipe key>`` (the tiny one keeps its historical
``tiny-policy/`` folder). ``python -m repro.data policy <name>`` builds one and prints its figures.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

# Names only at import: the config rules and the resume check ask "is this a built-in name?" before a
# run imports torch (main_ppo refuses a changed resume in a fraction of a second); recipes load on use.
BUILT_ON = {"tiny": "cpu", "qwen3-0.6b-arith": "cuda"}
"""Each built-in policy and the device its build runs on (part of its cache key)."""
NAMES = tuple(BUILT_ON)

if TYPE_CHECKING:
    from repro.data.sft import SFTRecipe


@dataclass(frozen=True)
class BuiltInPolicy:
    """A named recipe and where it is built."""

    name: str
    recipe: SFTRecipe
    device_type: str
    """``cpu`` or ``cuda``: the device the build runs on (part of its cache key)."""
    folder: str
    """Cache folder under ``$REPRO_CACHE_DIR``."""
    minutes: float
    """About how long the build takes there (said before a run starts one)."""

    def cached(self) -> Path:
        from repro.data.sft import cached_policy_dir

        return cached_policy_dir(self.recipe, self.device_type, self.folder)

    def is_built(self) -> bool:
        from repro.data.sft import read_report

        return read_report(self.cached()) is not None

    def other_library_builds(self) -> dict[str, dict[str, str]]:
        """Builds of this recipe on this device type cached under other library versions, by folder name: the
        versions that differ from this process's. A run here cannot use them (the versions are in the cache key:
        another release gives other weights), so saying so explains a rebuild where a build was expected, e.g. a
        build under one environment's transformers and runs under another's."""
        import json

        from repro.data.sft import library_versions, read_report

        here, recipe = library_versions(), json.loads(json.dumps(self.recipe.as_dict()))
        out = {}
        for folder in sorted(p for p in self.cached().parent.glob("*") if p != self.cached()):
            report = read_report(folder) if folder.is_dir() else None
            if report and report.get("recipe") == recipe and report.get("device") == self.device_type:
                differ = {k: v for k, v in report.get("libraries", {}).items() if here.get(k) != v}
                if differ:
                    out[folder.name] = differ
        return out

    def is_shipped(self) -> bool:
        """Copied from the files repro ships (``repro.data.tiny_fixture``), not trained on this machine."""
        from repro.data import tiny_fixture

        return tiny_fixture.serves(self.recipe, self.device_type, self.folder)

    def ensure(self, out_dir: str | os.PathLike[str] | None = None) -> Path:
        """The built policy's folder (copied to ``out_dir`` when given), building it if needed."""
        import torch

        from repro.data.sft import ensure_tiny_policy

        if self.device_type == "cuda" and not self.is_built() and not torch.cuda.is_available():
            raise ValueError(
                f"model.path={self.name} is built on a CUDA GPU and none is visible here: build it on a GPU machine "
                f"(python -m repro.data policy {self.name}) and copy {self.cached()} to the same path here, "
                "or pass a Hugging Face model folder")
        return ensure_tiny_policy(out_dir, self.recipe, torch.device(self.device_type), self.folder)


# lr 3e-4 with 50 warm-up steps, betas (0.9, 0.95), batch 256, pure bf16: on an H100 (2026-11-26) held-out
# accuracy 0.06 / 0.145 / 0.27 / 0.47 at steps 50 / 60 / 70 / 80, so the 10-step check stopped it at 0.47
# after 80 steps and 39 s (results/seed_scale/README.md): inside the 0.2-0.5 band that leaves GRPO room.
@functools.cache
def _registry() -> dict[str, BuiltInPolicy]:
    from repro.data.sft import SFTRecipe
    from repro.data.tiny_model import QWEN3_0P6B_SHAPE

    qwen3_0p6b_arith = SFTRecipe(shape=QWEN3_0P6B_SHAPE, batch_size=256, lr=3e-4, warmup_steps=50, betas=(0.9, 0.95),
                                 weight_decay=0.0, dtype="bfloat16", threshold=0.3, max_steps=600)
    policies = [BuiltInPolicy("tiny", SFTRecipe(), BUILT_ON["tiny"], "tiny-policy", 0.5),
                BuiltInPolicy("qwen3-0.6b-arith", qwen3_0p6b_arith, BUILT_ON["qwen3-0.6b-arith"], "qwen3-0.6b-arith", 1.5)]
    return {p.name: p for p in policies}


def is_built_in(path: str | None) -> bool:
    """Whether a ``model.path`` value names a built-in policy rather than a folder."""
    return path in NAMES


def built_in(name: str) -> BuiltInPolicy:
    """The built-in policy ``name``; ``ValueError`` listing the names otherwise."""
    if name not in NAMES:
        raise ValueError(f"{name!r} is not a built-in policy; choose one of {sorted(NAMES)}")
    return _registry()[name]
