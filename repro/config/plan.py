"""The effective plan of a run: what each role gets (DeepSpeed JSON, batch split, env knobs).

``python -m repro.main_ppo ... trainer.dry_run=true`` prints :func:`effective_plan`.
:func:`role_ds_config` calls ``repro.config.ds_config.build_ds_config`` with the arguments the workers'
engines pass (the role's DeepSpeed section and optimizer, the role's batch plan, its clip value;
the frozen reference policy with the actor's plan), so the dry run shows the DeepSpeed config each
role gets.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from repro.batching.plan import RoleBatchPlan
from repro.config import (
    ENV_KNOBS,
    DeepSpeedConfig,
    RunConfig,
    critic_enabled,
    ref_policy_used,
)
from repro.config.rules import plan_role_batch

ROLES = ("actor", "critic", "ref")


def resolve_on_cuda(cfg: RunConfig) -> bool:
    """trainer.device: cuda, cpu, or auto (what the workers decide: CUDA unless DS_ACCELERATOR=cpu or no GPU)."""
    if cfg.trainer.device != "auto":
        return cfg.trainer.device == "cuda"
    from repro.devices import on_cpu

    return not on_cpu()


def role_enabled(cfg: RunConfig, role: str) -> bool:
    """actor always; critic per :func:`critic_enabled`; ref with a KL loss or an in-reward KL."""
    if role not in ROLES:
        raise ValueError(f"role={role!r} is not valid; choose one of {list(ROLES)}")
    return (
        role == "actor"
        or (role == "critic" and critic_enabled(cfg))
        or (role == "ref" and ref_policy_used(cfg))
    )


def role_deepspeed_section(cfg: RunConfig, role: str) -> DeepSpeedConfig:
    arr = cfg.actor_rollout_ref
    return {"actor": arr.actor.deepspeed, "critic": cfg.critic.deepspeed_config, "ref": arr.ref.deepspeed}[
        role
    ]


def role_batch_plan(cfg: RunConfig, role: str) -> RoleBatchPlan:
    """The reference policy runs forward only on the actor's shards, so it takes the actor's plan."""
    return plan_role_batch(cfg, "critic" if role == "critic" else "actor")


def role_model_size(cfg: RunConfig, role: str, ds: DeepSpeedConfig) -> Any:
    """The model size a size-aware ZeRO-3 role's engine sizes its buckets from (else None; None: unknown)."""
    from repro.config.zero3 import model_size_for_path

    if ds.zero_stage != 3 or not ds.zero3_size_aware:
        return None
    model = cfg.critic.model if role == "critic" else cfg.actor_rollout_ref.model
    return model_size_for_path(model.path)


def role_ds_config(cfg: RunConfig, role: str, *, on_cuda: bool) -> dict[str, Any] | None:
    """The DeepSpeed JSON of ``role`` ("actor", "critic", "ref"), None when the role is not used."""
    from repro.config.ds_config import build_ds_config

    if not role_enabled(cfg, role):
        return None
    plan = role_batch_plan(cfg, role)
    ds = role_deepspeed_section(cfg, role)
    size = role_model_size(cfg, role, ds)
    if role == "critic":
        return build_ds_config(ds, cfg.critic.optim, plan, grad_clip=cfg.critic.grad_clip, on_cuda=on_cuda,
                               model_size=size)
    actor = cfg.actor_rollout_ref.actor
    if role == "actor":
        return build_ds_config(ds, actor.optim, plan, grad_clip=actor.grad_clip, on_cuda=on_cuda, model_size=size)
    # Frozen: build_ds_config leaves out optimizer and scheduler; the clip value is the actor's, as the
    # reference worker passes it.
    return build_ds_config(ds, actor.optim, plan, grad_clip=actor.grad_clip, on_cuda=on_cuda, trainable=False,
                           model_size=size)


def _zero3_leaves(cfg: RunConfig, role: str, ds: Any) -> list[str] | None:
    """The decoder layer classes a ZeRO-3 role fetches as leaf modules (None: not used or unknown)."""
    from repro.config.zero3 import leaf_names_for_path, use_leaves

    model = cfg.critic.model if role == "critic" else cfg.actor_rollout_ref.model
    if not use_leaves(ds.zero_stage, ds.zero3_leaf_modules, model.lora_rank > 0):
        return None
    return leaf_names_for_path(model.path)


def effective_plan(cfg: RunConfig, *, on_cuda: bool | None = None) -> dict[str, Any]:
    """Everything a run would use, as JSON-ready data (``warnings`` holds the plan's own notes)."""
    from repro.config.ds_config import resolve_offload, role_zero3_sizes

    on_cuda = resolve_on_cuda(cfg) if on_cuda is None else on_cuda
    out: dict[str, Any] = {"device": "cuda" if on_cuda else "cpu", "batch": {}, "warnings": []}
    for role in ROLES:
        if not role_enabled(cfg, role):
            out[role] = {"enabled": False, "deepspeed": None}
            if role != "ref":
                out["batch"][role] = None
            continue
        if role == "ref" and cfg.actor_rollout_ref.model.lora_rank > 0:
            # A LoRA actor is its own reference (adapters disabled): no engine of its own.
            out[role] = {"enabled": True, "in_actor": True, "deepspeed": None}
            continue
        ds = role_deepspeed_section(cfg, role)
        offload = resolve_offload(ds.zero_stage, ds.offload, bool(ds.param_offload), ds.offload_dir)
        if offload.note:
            out["warnings"].append(f"{role}: {offload.note}")
        out[role] = {
            "enabled": True,
            "deepspeed": role_ds_config(cfg, role, on_cuda=on_cuda),
            "offload": dataclasses.asdict(offload),
            "knobs": {knob: getattr(ds, name) for knob, name in ENV_KNOBS.items()},
            "zero3_leaf_modules": _zero3_leaves(cfg, role, ds),
        }
        sizes = role_zero3_sizes(ds, role_model_size(cfg, role, ds))
        if sizes is not None:
            out[role]["zero3_sizes"] = {key: dataclasses.asdict(size) for key, size in sizes.items()}
        if role != "ref":
            out["batch"][role] = dataclasses.asdict(role_batch_plan(cfg, role))
    actor_ds = role_deepspeed_section(cfg, "actor")
    out["env_knobs"] = {knob: getattr(actor_ds, name) for knob, name in ENV_KNOBS.items()}
    config = dataclasses.asdict(cfg)
    config.pop("defaults", None)
    out["config"] = config
    return out


def plan_summary(plan: dict[str, Any]) -> list[str]:
    """Human-readable lines of :func:`effective_plan` (printed before the JSON line)."""
    lines = [f"device: {plan['device']}"]
    for role in ROLES:
        section = plan[role]
        if not section["enabled"]:
            lines.append(f"{role}: not used")
            continue
        if section.get("in_actor"):
            lines.append(f"{role}: the actor's base model with the LoRA adapters disabled (no engine of its own)")
            continue
        zero = section["deepspeed"]["zero_optimization"]
        off = section["offload"]
        dtype = "bf16" if section["deepspeed"]["bf16"]["enabled"] else "fp32"
        text = (
            f"{role}: ZeRO-{zero['stage']}, offload optimizer={off['optimizer']} param={off['param']}, "
            f"{dtype}"
        )
        if section.get("zero3_leaf_modules"):
            text += f", ZeRO-3 leaf modules {','.join(section['zero3_leaf_modules'])}"
        if section.get("zero3_sizes"):
            text += ", ZeRO-3 sizes " + " ".join(f"{key}={size['value']} ({size['source']})"
                                                for key, size in section["zero3_sizes"].items())
        batch = plan["batch"].get(role)
        if batch:
            text += (
                f"; world={batch['world']} dp={batch['dp']} sp={batch['sp']} per-rank mini={batch['per_rank_mini']}"
                f" micro={batch['micro']} GAS={batch['gas']}"
                f" DeepSpeed train_batch_size={section['deepspeed']['train_batch_size']}"
                f" mini-batches/step={batch['num_mini_batches']}" + (" (dynamic)" if batch["dynamic"] else "")
            )
        lines.append(text)
    lines.append("env knobs: " + " ".join(f"{k}={int(v)}" for k, v in plan["env_knobs"].items()))
    return lines
