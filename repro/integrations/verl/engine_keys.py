"""The keys of verl's ``deepspeed`` engine section, derived from repro's own DeepSpeed section; no verl needed.

:class:`DeepSpeedEngineKeys` *is* :class:`repro.config.DeepSpeedConfig` (a subclass: every DeepSpeed
key, its default, its doc and its validation come from there, so none is restated) plus the three
engine keys verl's trainer sets on a role's engine section (``strategy``,
``ulysses_sequence_parallel_size``, ``dtype``). verl's :class:`~repro.integrations.verl.config.DeepSpeedEngineConfig`
is this class and verl's ``EngineConfig`` together, and declares no key of its own.

``hydra_config/engine/deepspeed.yaml`` (what verl's trainer composes) is generated from these
dataclasses by :func:`render_engine_yaml`: ``python -m repro.integrations.verl.engine_keys`` writes
it, and ``tests/unit/config/test_verl_engine_keys.py`` fails when the file and the dataclasses
differ (a key added, removed or given another default on one side only).

The seed DeepSpeed PR's command lines name the critic's section ``critic.deepspeed_config`` (repro's own
trainer's name; ``critic.deepspeed`` in verl). ``hydra_config/engine/deepspeed_config.yaml`` is that
section for verl's trainer, generated here too: repro's DeepSpeed keys, each null (unset), and
:func:`fold_seed_keys` moves the keys a command sets into the engine section, so each key keeps one
definition (``DeepSpeedConfig``'s).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from repro.config import ConfigFieldError, DeepSpeedConfig, LayerKernels, resolve_env_knobs
from repro.config.ds_config import OffloadPlan, resolve_offload
from repro.config.fields import check_sp_size, field_docs
from repro.config.rules import compile_refusal

STRATEGY = "deepspeed"
# verl's EngineConfig.dtype values -> repro's DeepSpeedConfig.model_dtype.
DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float32": "float32", "fp32": "float32"}

ENGINE_YAML = Path(__file__).with_name("hydra_config") / "engine" / "deepspeed.yaml"
TARGET = "repro.integrations.verl.config.deepspeed_engine_config"
SEED_YAML = ENGINE_YAML.with_name("deepspeed_config.yaml")

VERL_ENGINE_KEYS: dict[str, Any] = {
    "optimizer_offload": False,
    "forward_only": False,
    "seed": 42,
    "use_dynamic_bsz": False,
    "max_token_len_per_gpu": None,
    "micro_batch_size_per_gpu": None,
    "use_remove_padding": True,
}
"""Keys of verl's own ``EngineConfig`` that the yaml sets (verl's workers fill them from the role
config); their meaning and validation are verl's. ``tests/verl_parity/engine`` checks each is an
``EngineConfig`` field."""


def bad_key(key: str, value: Any, detail: str) -> ValueError:
    """The one-line error of an engine key, named as verl's trainer spells it."""
    return ValueError(f"deepspeed.{key}={value!r} {detail}")


@dataclass
class DeepSpeedEngineKeys(DeepSpeedConfig, LayerKernels):
    """repro's DeepSpeed section (inherited whole), the layer keys of repro's model section (``compile_layers``,
    ``flash_attention``: verl's model section is verl's, so they are engine keys here), and the engine keys verl's
    trainer sets."""

    strategy: str = STRATEGY
    """Engine backend of the role; only ``deepspeed``."""
    ulysses_sequence_parallel_size: int = 1
    """Ulysses sequence-parallel group size (DeepSpeed's UlyssesSPAttentionHF); divides the world size."""
    dtype: str | None = None
    """verl's generic engine dtype (bfloat16, bf16, float32, fp32): fills ``model_dtype`` when that is auto;
    a value that contradicts ``model_dtype`` is refused."""

    def __post_init__(self) -> None:
        if self.strategy != STRATEGY:
            raise bad_key("strategy", self.strategy, f"is not valid for this engine; choose one of {[STRATEGY]}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise bad_key("dtype", self.dtype, f"is not valid; choose one of {sorted(DTYPES)}")
        if self.dtype is not None and self.model_dtype != "auto" and DTYPES[self.dtype] != self.model_dtype:
            raise bad_key("dtype", self.dtype, f"contradicts deepspeed.model_dtype={self.model_dtype!r}; set one of them")
        try:
            check_sp_size(self)
            super().__post_init__()  # repro's validation of every DeepSpeed key, named as verl's key
            LayerKernels.__post_init__(self)  # DeepSpeedConfig's does not chain to it
        except ConfigFieldError as err:
            raise ValueError(err.at("deepspeed")) from None
        why = compile_refusal(self.zero_stage) if self.compile_layers != "off" else None
        if why:
            raise bad_key("compile_layers", self.compile_layers, f"with deepspeed.zero_stage={self.zero_stage}: {why}")
        # The stage-aware offload rule (nvme needs ZeRO-3 and offload_dir), env knobs read.
        self.check_offload(self.offload_plan())

    def check_offload(self, plan: OffloadPlan) -> None:
        """What a subclass's own keys must agree with in the offload plan (verl's ``optimizer_offload``)."""

    def repro_deepspeed(self) -> DeepSpeedConfig:
        """repro's DeepSpeed section with every one of its keys from here, env knobs read (``resolve_env_knobs``)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(DeepSpeedConfig)}
        if self.dtype is not None and self.model_dtype == "auto":
            values["model_dtype"] = DTYPES[self.dtype]
        return resolve_env_knobs(DeepSpeedConfig(**values))

    def offload_plan(self, ds: DeepSpeedConfig | None = None) -> OffloadPlan:
        """Where optimizer states and parameters live (``ds``: this section's :meth:`repro_deepspeed`)."""
        ds = self.repro_deepspeed() if ds is None else ds
        return resolve_offload(ds.zero_stage, ds.offload, bool(ds.param_offload), ds.offload_dir)


def engine_keys() -> dict[str, Any]:
    """Every key of the engine yaml with its default, in the yaml's order."""
    keys = {f.name: f.default for f in dataclasses.fields(DeepSpeedEngineKeys)}
    assert all(v is not dataclasses.MISSING for v in keys.values()), "every engine key needs a plain default"
    return {"strategy": keys.pop("strategy"), **keys, **VERL_ENGINE_KEYS}


_YAML_WORDS = ("true", "false", "null", "yes", "no", "on", "off", "y", "n", "~")


def _yaml_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str) and value.lower() in _YAML_WORDS:
        return f'"{value}"'  # YAML 1.1 (PyYAML, under OmegaConf) reads these as booleans or null
    if isinstance(value, str) and value.replace("_", "").isalnum():
        return value
    raise TypeError(f"no yaml spelling for the default {value!r}: extend _yaml_value")


def render_engine_yaml() -> str:
    """``hydra_config/engine/deepspeed.yaml`` as the dataclasses define it (each key's doc as its comment)."""
    docs = field_docs(DeepSpeedEngineKeys)
    lines = [
        "# GENERATED from repro.config.DeepSpeedConfig and repro.integrations.verl.engine_keys: do not edit;",
        "# change the dataclasses, then run `python -m repro.integrations.verl.engine_keys` to rewrite it.",
        "# The DeepSpeed engine section of one role (repro.integrations.verl.config.DeepSpeedEngineConfig);",
        "# the DeepSpeed keys mean what they mean in repro's own trainer.",
        f"_target_: {TARGET}",
    ]
    docs[next(iter(VERL_ENGINE_KEYS))] = "verl's generic engine keys (filled by verl's workers from the role config)."
    for key, value in engine_keys().items():
        lines.append("")
        lines += [f"# {line}".rstrip() for line in docs.get(key, "").splitlines()]
        lines.append(f"{key}: {_yaml_value(value)}")
    return "\n".join(lines) + "\n"


def seed_keys() -> list[str]:
    """The keys of the seed's ``critic.deepspeed_config``: repro's own DeepSpeed section's, all of them."""
    return [f.name for f in dataclasses.fields(DeepSpeedConfig)]


def render_seed_yaml() -> str:
    """``hydra_config/engine/deepspeed_config.yaml``: every key of :func:`seed_keys`, null (unset).

    Null, not the default: only a key the command sets may move into the engine section (a default
    here would overwrite a ``critic.deepspeed.<key>`` the same command sets)."""
    lines = [
        "# GENERATED from repro.config.DeepSpeedConfig by repro.integrations.verl.engine_keys: do not edit.",
        "# The seed DeepSpeed PR's critic.deepspeed_config (repro's trainer's name of the critic's DeepSpeed",
        "# section): each key null = unset; one the command sets moves into critic.deepspeed.<key>",
        "# (DeepSpeedCriticConfig, repro.integrations.verl.engine_keys.fold_seed_keys), where engine/deepspeed.yaml",
        "# defines it.",
    ]
    lines += [f"{key}: null" for key in seed_keys()]
    return "\n".join(lines) + "\n"


def fold_seed_keys(engine: Any, seed: dict[str, Any]) -> dict[str, Any]:
    """The engine-section values that the seed-form keys ``seed`` (full key -> value, null = unset) set.

    ``engine`` is the role's built engine section; a key the command also set there to another
    value is refused, naming both, rather than one silently winning."""
    defaults = engine_keys()
    out: dict[str, Any] = {}
    for full_key, value in seed.items():
        key = full_key.rsplit(".", 1)[-1]
        if value is None:
            continue
        if key not in defaults:
            raise ValueError(f"{full_key} is not a key of the DeepSpeed engine; choose from {sorted(defaults)}")
        here = getattr(engine, key)
        if here != defaults[key] and here != value:
            raise ValueError(f"{full_key}={value!r} contradicts deepspeed.{key}={here!r} (the same key); set one of them")
        out[key] = value
    return out


def main(argv: list[str]) -> int:
    """``--check``: exit 1 when a generated yaml differs from the dataclasses; else rewrite them."""
    status = 0
    for path, text in ((ENGINE_YAML, render_engine_yaml()), (SEED_YAML, render_seed_yaml())):
        if "--check" in argv:
            same = path.read_text() == text
            print(f"{path}: {'up to date' if same else 'differs from the dataclasses; rewrite it'}")
            status |= 0 if same else 1
        else:
            path.write_text(text)
            print(f"wrote {path}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
