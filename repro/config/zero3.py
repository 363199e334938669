"""Size-aware ZeRO-3 defaults: the bucket, prefetch and persistence sizes taken from the model's width.

DeepSpeed 0.19.8's ZeRO-3 sizes are constants (``deepspeed/runtime/zero/config.py``), whatever the
model: ``reduce_bucket_size`` 5e8 elements, ``stage3_prefetch_bucket_size`` 5e7,
``stage3_param_persistence_threshold`` 1e5, ``stage3_max_live_parameters`` and
``stage3_max_reuse_distance`` 1e9. Hugging Face's DeepSpeed integration fills the first three from
the hidden size ``h`` when a config says ``"auto"`` (transformers 5.17,
``integrations/deepspeed.py``, ``HfTrainerDeepSpeedConfig.trainer_config_finalize``):
``reduce_bucket_size = h * h``, and at ZeRO-3 ``stage3_prefetch_bucket_size = int(0.9 * h * h)`` and
``stage3_param_persistence_threshold = 10 * h``, ``h`` read from ``config.hidden_size``, else the
largest of ``config.hidden_sizes``, else the same under ``config.text_config``. :func:`zero3_sizes`
applies that rule at ZeRO-3 to the keys the user left unset when ``deepspeed.zero3_size_aware`` is
true; the two memory caps keep DeepSpeed's values (see :func:`zero3_sizes`). ``repro.config.ds_config``
writes the values into the DeepSpeed JSON and the dry-run plan shows each with its reason.

The switch is off by default, and DeepSpeed's constants stay: measured on one H200 at the
Qwen3-0.6B shape (``results/bench/zero3_defaults.md``) the size-aware sizes cut the peak allocated
memory by 0.9 GB (the gradient bucket) but were no faster (1.54 s/step against 1.28 and 1.31, one
round; with CPU offload 1.97 against 1.98), since every weight matrix then overflows the
``h * h`` bucket and is reduced on its own.

Why each size is what it is (``deepspeed/runtime/zero/stage3.py`` and
``partitioned_param_coordinator.py`` of 0.19.8):

- ``reduce_bucket_size``: ZeRO-3 allocates one contiguous gradient bucket of exactly this many
  elements per gradient dtype for the whole run (``torch.empty(self.reduce_bucket_size)``), and
  reduce-scatters it when the next gradient would overflow it. 5e8 is 1 GB in bf16 (2 GB in fp32)
  held on every GPU even for a 0.6B model, and the bucket then fills only once per backward, so the
  reduce-scatter (on its own stream, ``overlap_comm`` is on at ZeRO-3) cannot overlap the backward.
  ``h * h`` is about one weight matrix: a few MB, and the reduction runs as the backward goes.
- ``stage3_prefetch_bucket_size``: how many parameter elements the coordinator all-gathers ahead of
  the module now running. ``0.9 * h * h`` is about one weight matrix ahead.
- ``stage3_param_persistence_threshold``: parameters smaller than this stay whole on every rank
  (never fetched). ``10 * h`` keeps the norms and biases (``h`` elements or fewer) whole and
  partitions every weight matrix; 1e5 keeps whole matrices of small models (a 64 x 128 projection)
  unpartitioned, so ZeRO-3 then shards nothing of them.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from typing import Any

# DeepSpeed 0.19.8's values (DeepSpeedZeroConfig field defaults).
DEEPSPEED_REDUCE_BUCKET_SIZE = 500_000_000
DEEPSPEED_PREFETCH_BUCKET_SIZE = 50_000_000
DEEPSPEED_PERSISTENCE_THRESHOLD = 100_000
DEEPSPEED_MAX_LIVE_PARAMETERS = 1_000_000_000
DEEPSPEED_MAX_REUSE_DISTANCE = 1_000_000_000

SIZE_KEYS = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")
"""The ``zero_optimization`` keys the size-aware rule fills (the ``DeepSpeedConfig`` field names)."""


@dataclass(frozen=True)
class ModelSize:
    """What the rule reads from a model: its width (the only input of transformers' rule)."""

    hidden_size: int
    """Width ``h`` as Hugging Face's DeepSpeed integration finds it (:func:`hidden_size_of`)."""

    def __post_init__(self) -> None:
        if self.hidden_size < 1:
            raise ValueError(f"ModelSize needs hidden_size >= 1, got {self}")


@dataclass(frozen=True)
class Zero3Size:
    """One chosen ZeRO-3 size and where it came from."""

    value: int
    source: str
    """``user``, ``size-aware`` or ``deepspeed`` (DeepSpeed's constant)."""
    why: str


def hidden_size_of(config: Any) -> int | None:
    """``h`` by Hugging Face's lookup order (a ``PretrainedConfig`` or a ``config.json`` dict)."""

    def get(obj: Any, key: str) -> Any:
        return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)

    for section in (config, get(config, "text_config")):
        if section is None:
            continue
        if get(section, "hidden_size"):
            return int(get(section, "hidden_size"))
        if get(section, "hidden_sizes"):
            return int(max(get(section, "hidden_sizes")))
    return None


def zero3_sizes(user: dict[str, int | None], size: ModelSize | None, enabled: bool = True) -> dict[str, Zero3Size]:
    """The ZeRO-3 sizes of one role: ``user`` values win, then the size rule, then DeepSpeed's.

    ``user`` maps each of :data:`SIZE_KEYS` to the value set in the config (None: unset). Without a
    model size (``size`` None: the model folder is unknown to the plan) or with ``enabled`` False the
    unset keys get DeepSpeed's constants. ``stage3_max_live_parameters`` and
    ``stage3_max_reuse_distance`` are memory caps, not speed knobs: they keep DeepSpeed's 1e9, which
    binds only above 1e9 parameters (then they stop ZeRO-3 from holding the whole model gathered),
    and issue 15 measured larger limits slower with leaf modules (4707 against 5680 tokens/s/GPU).
    """
    constants = {
        "reduce_bucket_size": DEEPSPEED_REDUCE_BUCKET_SIZE,
        "stage3_prefetch_bucket_size": DEEPSPEED_PREFETCH_BUCKET_SIZE,
        "stage3_param_persistence_threshold": DEEPSPEED_PERSISTENCE_THRESHOLD,
    }
    rule: dict[str, tuple[int, str]] = {}
    if size is not None and enabled:
        h = size.hidden_size
        rule = {
            "reduce_bucket_size": (h * h, f"h*h with h={h}: a bucket of about one weight matrix instead of a "
                                          f"{DEEPSPEED_REDUCE_BUCKET_SIZE:.0e}-element buffer held all run"),
            "stage3_prefetch_bucket_size": (int(0.9 * h * h), f"0.9*h*h with h={h}: about one weight matrix "
                                                              "fetched ahead"),
            "stage3_param_persistence_threshold": (10 * h, f"10*h with h={h}: norms and biases stay whole, "
                                                           "every weight matrix is partitioned"),
        }
    why_off = ("model size unknown" if enabled else
               "deepspeed.zero3_size_aware=false: the size-aware sizes were no faster at the Qwen3-0.6B shape, "
               "results/bench/zero3_defaults.md")
    out: dict[str, Zero3Size] = {}
    for key in SIZE_KEYS:
        if user.get(key) is not None:
            out[key] = Zero3Size(int(user[key]), "user", "set in the config")
        elif key in rule:
            out[key] = Zero3Size(rule[key][0], "size-aware", rule[key][1])
        else:
            out[key] = Zero3Size(constants[key], "deepspeed", f"DeepSpeed's default ({why_off})")
    return out


def model_size_of(module: Any) -> ModelSize | None:
    """The size of a loaded model (None when its config has no hidden size)."""
    h = hidden_size_of(getattr(module, "config", None) or {})
    return None if h is None else ModelSize(h)


@functools.lru_cache(maxsize=8)
def model_size_for_path(path: str) -> ModelSize | None:
    """The size a model folder would give, from its ``config.json`` alone (the plan asks; None: unknown).

    A built-in policy (``tiny``, ...) is sized from its recipe.
    """
    from repro.data.policies import built_in, is_built_in

    if is_built_in(path):
        return ModelSize(built_in(path).recipe.shape.hidden_size)
    file = os.path.join(path, "config.json")
    if not os.path.isfile(file):
        return None
    with open(file) as f:
        h = hidden_size_of(json.load(f))
    return None if h is None else ModelSize(h)


def use_leaves(zero_stage: int, enabled: bool, lora: bool) -> bool:
    """Whether a role fetches its decoder layers as ZeRO-3 leaf modules (the plan and the engine ask).

    Not a LoRA model: with its decoder layers as leaves, the stage-3 backward fails on DeepSpeed
    0.19.8 (a 0-size gradient against the adapters' shapes; tests/distributed/workers/test_lora.py
    at stage 3), so it keeps DeepSpeed's per-submodule hooks.
    """
    return zero_stage == 3 and enabled and not lora


def leaf_names_for_path(path: str) -> list[str] | None:
    """The leaf class names a model folder would get, without loading weights (for the plan).

    A built-in policy is a Qwen3; None when the folder or its architecture is unknown.
    """
    from repro.data.policies import is_built_in

    if is_built_in(path):
        model_type = "qwen3"
    else:
        config = os.path.join(path, "config.json")
        if not os.path.isfile(config):
            return None
        with open(config) as f:
            model_type = json.load(f).get("model_type")
    # Imported only now: transformers' model mapping costs ~5 s of imports, which a dry run of a command
    # whose model folder is not on this machine (the docs' examples) need not pay.
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    cls: Any = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type, ""), None)
    names = getattr(cls, "_no_split_modules", None) if cls is not None else None
    return sorted(names) if names else None
