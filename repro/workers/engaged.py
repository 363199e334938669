"""What a built role really does, read back from DeepSpeed, the module and the inputs it was fed.

A config can ask for offload, ZeRO-3 leaf modules, remove-padding, LoRA or Ulysses and still not
get it: a stage ignores an offload section, a leaf mark set after ``deepspeed.initialize`` is never
registered, a flag is dropped on its way to the worker. A test that checks the config it passed
in cannot see any of that, so every test claiming one of these features asserts this report
instead (issue 36, item 5; ``results/engaged_features.md`` lists each claim and the deliberate
break that turns it red). Each entry is read from the object that does the work:

- ``overlap_comm``: whether DeepSpeed reduces gradients on its side stream (its default or the key);
  ``linear``: ``deepspeed`` while ZeRO-3's replacement of ``torch.nn.functional.linear`` is in place, else
  ``torch`` (:mod:`repro.workers.zero3_linear`);
- ``stage``, ``optimizer``, ``param``: the ZeRO stage DeepSpeed built and where its optimizer
  states and parameter partitions are (:mod:`repro.workers.placement`);
- ``zero3_leaves``: one class name per module that DeepSpeed registered as a ZeRO-3 leaf (its
  parameters carry DeepSpeed's ``ds_z3_leaf_module`` back-reference, set only when the mark was
  there at ``deepspeed.initialize``); ``zero3_hooked_in_leaves``: submodules of those leaves that
  still got DeepSpeed's own fetch hooks (``ds_id``; 0 when the leaf is honoured);
  ``zero3_persistent_params``: parameters ZeRO-3 keeps whole on every rank (DeepSpeed's ``ds_persist``, set
  from ``stage3_param_persistence_threshold`` at initialize; 0 below ZeRO-3); ``zero3_persistent_gather``: how the
  optimizer gathers those after a step, ``coalesced`` or DeepSpeed's ``per_parameter``
  (:mod:`repro.workers.zero3_persist_gather`; None without a ZeRO-3 optimizer); ``zero3_hooked_modules``: modules
  still carrying DeepSpeed's ZeRO-3 fetch hook, read from the hooks' handles (the root included; the others lose
  theirs where all their parameters stay whole: :mod:`repro.workers.zero3_persist_hooks`; None below ZeRO-3);
  ``overflow_check``: how a ZeRO-1/2 optimizer tests its gradients for inf / NaN before a step, ``fused`` or
  DeepSpeed's ``per_tensor`` (:mod:`repro.workers.overflow_check`; None without a ZeRO-1/2 optimizer);
  ``throughput_timer_syncs``: whether DeepSpeed's throughput timer synchronizes the device around every forward
  (its default; ``repro.config.ds_config`` turns the timer off);
- ``lora_layers``: peft LoRA layers holding an adapter; ``optimizer_params`` /
  ``optimizer_base_params``: parameters the DeepSpeed optimizer updates, and how many of them are
  not adapters (0 when the base is frozen); ``trainable_base_params``: base parameters with
  ``requires_grad``;
- ``sp``: the size of DeepSpeed's sequence-parallel process group (1 without one);
  ``attention``: the attention implementation the model runs (Ulysses' ``repro_ulysses_<role>``);
  ``flash_attention``: the kernels behind torch's flash ops in this process, read back from torch's registry
  (``torch``: its bundled FlashAttention-2; ``repro_fa4``: ``model.flash_attention=fa4``, :mod:`repro.workers.fa4_kernels`);
  ``fused_rms_norms``: norms running torch's fused kernel (:mod:`repro.workers.rms_norm`; 0 on CPU);
  ``compiled_layers``: modules whose calls run under ``torch.compile`` (``model.compile_layers``);
  ``gradient_checkpointing``: whether the model's layers checkpoint (the flag Hugging Face sets on each), and
  ``checkpointing_auto`` what ``enable_gradient_checkpointing=auto`` measured and chose (None before the first
  update or without ``auto``: :mod:`repro.workers.activation_checkpointing`);
- ``fed``: what :meth:`RoleEngine.forward` handed the model since the last :meth:`FedInputs.reset`
  (forwards, rows, tokens, the widths, and how many came with an attention mask): the packed rows
  of remove-padding carry no mask, fewer tokens than the padded batch and, where samples fit
  together, fewer rows than samples; a Ulysses rank gets its slice of the sequence.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from repro.workers import activation_checkpointing, rms_norm, varlen
from repro.workers.layer_compile import compiled_layers
from repro.workers.overflow_check import overflow_check
from repro.workers.placement import optimizer_placement, param_placement
from repro.workers.zero3_linear import linear_in_use
from repro.workers.zero3_persist_gather import persistent_gather
from repro.workers.zero3_persist_hooks import hooked_modules


@dataclass
class FedInputs:
    """The ``input_ids`` shapes the engine's forwards received (shapes only: no device sync)."""

    forwards: int = 0
    rows: int = 0
    """Sum of the rows (samples, or packed rows holding several) the forwards ran."""
    tokens: int = 0
    """Sum of ``input_ids.numel()``: real and pad tokens the model ran on."""
    masked: int = 0
    """Forwards that came with an attention mask (the padded layout)."""
    widths: list[int] = field(default_factory=list)
    """Distinct sequence widths, sorted."""

    def add(self, inputs: dict[str, Any]) -> None:
        ids = inputs.get("input_ids")
        if ids is None:
            return
        self.forwards += 1
        self.rows += int(ids.shape[0])
        self.tokens += int(ids.numel())
        self.masked += int(inputs.get("attention_mask") is not None)
        if int(ids.shape[-1]) not in self.widths:
            self.widths = sorted([*self.widths, int(ids.shape[-1])])

    def reset(self) -> None:
        self.forwards, self.rows, self.tokens, self.masked, self.widths = 0, 0, 0, 0, []


def _zero3_leaves(module: torch.nn.Module) -> tuple[list[str], int]:
    leaves: dict[int, torch.nn.Module] = {}
    for param in module.parameters():
        leaf = getattr(param, "ds_z3_leaf_module", None)
        if leaf is not None:
            leaves[id(leaf)] = leaf
    hooked = sum(1 for leaf in leaves.values() for sub in leaf.modules() if sub is not leaf and hasattr(sub, "ds_id"))
    return sorted(type(m).__name__ for m in leaves.values()), hooked


def _optimizer_params(engine: Any) -> list[torch.nn.Parameter]:
    """The parameters DeepSpeed's ZeRO optimizer updates (stage 1/2: ``bit16_groups``, 3: ``fp16_groups``)."""
    zero = getattr(engine, "optimizer", None)
    groups = getattr(zero, "bit16_groups", None) or getattr(zero, "fp16_groups", None) or []
    return [p for group in groups for p in group]


def _sp_size(engine: Any) -> int:
    import torch.distributed as dist

    group = getattr(engine, "seq_parallel_group", None) if engine is not None else None
    return dist.get_world_size(group) if group is not None else 1


def zero3_persistent_params(module: torch.nn.Module) -> int:
    """Parameters ZeRO-3 keeps whole on every rank (DeepSpeed's ``ds_persist``; 0 below ZeRO-3)."""
    return sum(1 for p in module.parameters() if getattr(p, "ds_persist", False))


def engine_report(role: Any) -> dict[str, Any]:
    """The read-backs of one ``RoleEngine`` (module docstring); plain values, so ranks can return them."""
    engine, module = role.engine, role.module
    names = {id(p): n for n, p in module.named_parameters()}
    in_optimizer = _optimizer_params(engine) if engine is not None else []
    leaves, hooked = _zero3_leaves(module)
    config = getattr(module, "config", None)
    return {
        "stage": int(engine.zero_optimization_stage()) if engine is not None else None,
        "overlap_comm": bool(engine.zero_overlap_comm()) if engine is not None else None,
        "linear": linear_in_use(),
        "optimizer": optimizer_placement(engine) if engine is not None else "none",
        "param": param_placement(engine) if engine is not None else "device",
        "zero3_leaves": leaves,
        "zero3_hooked_in_leaves": hooked,
        "zero3_persistent_params": zero3_persistent_params(module),
        "zero3_persistent_gather": persistent_gather(engine.optimizer) if engine is not None else None,
        "zero3_hooked_modules": hooked_modules(engine) if engine is not None else None,
        "overflow_check": overflow_check(engine.optimizer) if engine is not None else None,
        # whether DeepSpeed's throughput timer synchronizes the device around every forward (ds_config turns it off)
        "throughput_timer_syncs": _timer_syncs(engine) if engine is not None else None,
        "lora_layers": sum(1 for m in module.modules() if len(getattr(m, "lora_A", None) or {}) > 0),
        "optimizer_params": len(in_optimizer),
        "optimizer_base_params": sum(1 for p in in_optimizer if ".lora_" not in names.get(id(p), "")),
        "trainable_base_params": sum(1 for n, p in module.named_parameters() if p.requires_grad and ".lora_" not in n),
        "sp": _sp_size(engine),
        "attention": getattr(config, "_attn_implementation", None),
        "flash_attention": varlen.current_impl(),
        "fused_rms_norms": rms_norm.fused_count(module),
        "compiled_layers": compiled_layers(module),
        "gradient_checkpointing": activation_checkpointing.in_use(module),
        "checkpointing_auto": asdict(role.checkpointing) if role.checkpointing is not None else None,
        "fed": asdict(role.fed),
    }


def _timer_syncs(engine: Any) -> bool:
    timer = engine.tput_timer.config
    return bool(timer.enabled and timer.synchronized)


def rollout_report(rollout: Any) -> dict[str, Any]:
    """What generates: the rollout class built, and the engine inside it (``vllm.LLM`` or the HF model)."""
    inner = getattr(rollout, "llm", None) or getattr(rollout, "model", None)
    return {"rollout": type(rollout).__name__, "engine": type(inner).__name__ if inner is not None else None}
