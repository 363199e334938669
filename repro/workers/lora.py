"""LoRA on the actor (``actor_rollout_ref.model.lora_rank > 0``), built with peft.

- :func:`wrap` puts peft adapters on the policy before ``deepspeed.initialize``; only adapter
  parameters require gradients, so DeepSpeed's optimizer (and its states, at every ZeRO stage)
  covers the adapters only.
- :func:`adapters_disabled` runs the same module as the base model: the reference policy of a
  LoRA run (verl's ``ref_in_actor``), without a second copy of the weights.
- :func:`merged_weights` yields ``W + scaling * B @ A`` per adapted linear layer and every other
  base parameter, one tensor at a time with Hugging Face names (gathered at ZeRO-3): what the
  rollout loads and what a merged Hugging Face export writes.
- :func:`adapter_state` is the adapters alone (gathered at ZeRO-3), for a peft adapter folder.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from repro.workers.zero3_persist_gather import gathered

if TYPE_CHECKING:
    from repro.config import ModelConfig

ADAPTER = "default"
_PREFIX = "base_model.model."


def enabled(model_cfg: ModelConfig) -> bool:
    return model_cfg.lora_rank > 0


def is_lora(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a peft model (adapters on the base model)."""
    # A PeftModel exists only once peft is imported: runs without LoRA never pay for importing it.
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(module, peft.PeftModel)


def wrap(model: torch.nn.Module, model_cfg: ModelConfig) -> torch.nn.Module:
    """``model`` with LoRA adapters of ``model_cfg`` (A random from the torch seed, B zero)."""
    from peft import LoraConfig, get_peft_model

    targets = model_cfg.target_modules
    config = LoraConfig(
        r=model_cfg.lora_rank, lora_alpha=model_cfg.lora_alpha, lora_dropout=0.0, bias="none",
        target_modules=targets if isinstance(targets, str) else list(targets),
        exclude_modules=model_cfg.exclude_modules if isinstance(model_cfg.exclude_modules, (str, type(None)))
        else list(model_cfg.exclude_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def adapters_disabled(module: torch.nn.Module) -> contextlib.AbstractContextManager:
    """Context in which ``module`` computes as its base model (a no-op for a non-peft module)."""
    return module.disable_adapter() if is_lora(module) else contextlib.nullcontext()


def base_model(module: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model under the adapters (``save_pretrained`` of a full folder)."""
    return module.get_base_model() if is_lora(module) else module


def _gathered(params: list[torch.nn.Parameter], zero3: bool) -> contextlib.AbstractContextManager:
    # the parameters ZeRO-3 keeps whole stay whole (repro.workers.zero3_persist_gather.gathered)
    return gathered(params) if zero3 else contextlib.nullcontext()


def hf_name(peft_name: str) -> str:
    """``base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight`` -> ``model.layers.0.self_attn.q_proj.weight``."""
    name = peft_name[len(_PREFIX):] if peft_name.startswith(_PREFIX) else peft_name
    return name.replace(".base_layer.", ".")


def merged_weights(module: torch.nn.Module, zero3: bool) -> Iterator[tuple[str, torch.Tensor]]:
    """Base weights with the adapters merged, Hugging Face names, one tensor at a time."""
    for name, param in module.named_parameters():
        if ".lora_" in name:
            continue
        layer_name = name.rsplit(".base_layer.", 1)[0] if ".base_layer.weight" in name else None
        if layer_name is None:
            with _gathered([param], zero3):
                tensor = param.data.detach().clone()
            yield hf_name(name), tensor
            continue
        layer = module.get_submodule(layer_name)
        lora_params = [layer.lora_A[ADAPTER].weight, layer.lora_B[ADAPTER].weight]
        with _gathered([param, *lora_params], zero3):
            with torch.no_grad():
                tensor = param.data.detach().clone() + layer.get_delta_weight(ADAPTER).to(param.dtype)
        yield hf_name(name), tensor


def adapter_state(module: torch.nn.Module, zero3: bool) -> dict[str, torch.Tensor]:
    """The adapter parameters (peft names), full size, on CPU."""
    out = {}
    for name, param in module.named_parameters():
        if ".lora_" in name:
            with _gathered([param], zero3):
                out[name] = param.data.detach().to("cpu", copy=True)
    return out


def save_adapter(module: Any, out_dir: str, zero3: bool, is_writer: bool) -> None:
    """A peft adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``); all ranks call."""
    state = adapter_state(module, zero3)
    if is_writer:
        module.save_pretrained(out_dir, state_dict=state, safe_serialization=True)
