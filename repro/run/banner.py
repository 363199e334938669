"""The few lines a run prints about its own setup before its first step (console and train.log).

Without them a ZeRO-2 and a ZeRO-3 run, a LoRA run, an SP run and a remove-padding run look the
same on the console and in ``train.log``. The lines come from the config (batch split, rollout,
LoRA, SP, remove-padding) and, for ZeRO stage and offload, the LoRA layers and the SP group, and the
rollout built, from what each rank's engines report once built (``HybridWorker.engine_setup``,
``repro.workers.engaged``): an offload section a stage ignores shows as ``device``, not as asked.
"""

from __future__ import annotations

from typing import Any

from repro.config import RunConfig, critic_enabled, ref_policy_used
from repro.config.rules import plan_role_batch

_PLACE = {"cpu_offload": "cpu", "device": "device", "none": "none"}


def engine_words(setup: dict[str, Any] | None) -> str:
    """ZeRO stage and offload as the built engine reports them (also the verl engine's own line)."""
    if setup is None:
        return "no engine (frozen, plain module)"
    return (f"ZeRO-{setup['stage']}, offload (read back) optimizer={_PLACE.get(setup['optimizer'], setup['optimizer'])}"
            f" param={_PLACE.get(setup['param'], setup['param'])}")


def layout_words(dp: int, sp: int, setup: dict[str, Any] | None) -> str:
    """``dp D x sp S``, and the SP group the engine reports wherever either side is above 1."""
    read = f" (read back sp {setup['sp']})" if setup and "sp" in setup and max(sp, setup["sp"]) > 1 else ""
    return f"dp {dp} x sp {sp}{read}"


def fused_norm_words(setup: dict[str, Any] | None) -> list[str]:
    """The norms running torch's fused kernel and the layers running compiled, as counted on the module (none on a
    CPU, none without ``model.compile_layers``)."""
    words = [f"fused RMSNorm (read back: {setup['fused_rms_norms']} norms)"] if setup and setup.get("fused_rms_norms") else []
    if setup and setup.get("compiled_layers"):
        words.append(f"compiled layers (read back: {setup['compiled_layers']})")
    return words


def zero3_words(setup: dict[str, Any] | None) -> list[str]:
    """ZeRO-3's layout as the built engine reports it (none below ZeRO-3): a run with the layers' weights whole and
    DeepSpeed's hooks off them and one with DeepSpeed's defaults differ by 1.1-1.2x in their update
    (results/seed_scale/README.md, section 9), and the config alone cannot say what DeepSpeed kept."""
    if not setup or setup.get("stage") != 3:
        return []
    whole = f"{setup.get('zero3_persistent_params')} parameters whole"
    if setup.get("zero3_persistent_gather"):
        whole += f" (gathered {setup['zero3_persistent_gather']})"
    parts = [f"{len(setup.get('zero3_leaves') or [])} leaf modules", f"linear {setup.get('linear')}", whole]
    if setup.get("zero3_hooked_modules") is not None:
        parts.append(f"{setup['zero3_hooked_modules']} modules hooked")
    return [f"ZeRO-3 read back [{', '.join(parts)}]"]


def lora_readback(setup: dict[str, Any] | None) -> str:
    """The adapters the module holds and the base parameters the optimizer holds ('' without adapters)."""
    if not (setup and setup.get("lora_layers")):
        return ""
    return f" (read back: {setup['lora_layers']} adapter layers, {setup['optimizer_base_params']} base params in the optimizer)"


def _role_line(cfg: RunConfig, role: str, setup: dict[str, Any] | None) -> str:
    section = cfg.critic if role == "critic" else cfg.actor_rollout_ref.actor
    model = cfg.critic.model if role == "critic" else cfg.actor_rollout_ref.model
    plan = plan_role_batch(cfg, role)
    split = (f"token budget {plan.max_token_len}/micro-batch" if plan.dynamic
             else f"micro {plan.micro} x GAS {plan.gas}")
    words = [engine_words(setup), layout_words(plan.dp, plan.sp, setup), f"{split} per rank",
             f"{plan.num_mini_batches} mini-batch(es) x {section.ppo_epochs} epoch(s)/step",
             "remove-padding " + ("on" if model.use_remove_padding else "off"), *fused_norm_words(setup),
             *zero3_words(setup)]
    if role == "actor":
        lora = f"LoRA rank {model.lora_rank} alpha {model.lora_alpha}" if model.lora_rank else "LoRA off"
        words.append(lora + lora_readback(setup))
    return f"  {role}: " + ", ".join(words)


def _files_words(value: Any) -> str:
    if value is None:
        return "the built-in arithmetic task"
    files = [str(value)] if isinstance(value, str) else [str(v) for v in value]
    return ", ".join(files)


def inputs_lines(cfg: RunConfig) -> list[str]:
    """What the run reads: the model (a folder or a built-in policy), the data files and the reward.

    Printed by the banner and the dry run, so that a default never goes unnoticed (``-cn ppo_trainer``
    with no model path trains the built-in tiny policy)."""
    from repro.config import custom_reward
    from repro.data.policies import is_built_in

    path = cfg.actor_rollout_ref.model.path
    default = ", the default when no model folder is given" if path == RunConfig().actor_rollout_ref.model.path else ""
    model = f"built-in policy {path} (actor_rollout_ref.model.path={path}{default})" if is_built_in(path) else path
    tok = cfg.actor_rollout_ref.model.tokenizer_path
    plugin = custom_reward(cfg)
    reward = (f"{plugin[1].name} from {plugin[1].path} ({plugin[0]})" if plugin
              else "the rule rewards by data_source (openai/gsm8k, repro/arith)")
    return [f"  model: {model}" + (f", tokenizer {tok}" if tok else ""),
            f"  train data: {_files_words(cfg.data.train_files)}",
            f"  val data: {_files_words(cfg.data.val_files)}",
            f"  reward: {reward}"]


def banner_lines(cfg: RunConfig, engines: dict[str, dict[str, Any]], *, gpu: bool) -> list[str]:
    """The banner of ``cfg`` given rank 0's ``engine_setup()`` (role -> stage and placement)."""
    t, arr = cfg.trainer, cfg.actor_rollout_ref
    world = t.n_gpus_per_node * t.nnodes
    lines = [f"setup: DeepSpeed engine ({arr.actor.strategy}), {cfg.algorithm.adv_estimator}, "
             f"{world} {'GPU' if gpu else 'CPU'} rank(s) on {t.nnodes} node(s)"]
    lines.append(_role_line(cfg, "actor", engines.get("actor")))
    if ref_policy_used(cfg):
        ref = ("the actor with its LoRA adapters disabled" if arr.model.lora_rank
               else engine_words(engines.get("ref")))
        lines.append(f"  ref: {ref}")
    if critic_enabled(cfg):
        lines.append(_role_line(cfg, "critic", engines.get("critic")))
    r = arr.rollout
    lines.append(f"  rollout: {r.name}, {cfg.data.train_batch_size} prompts x n={r.n}, temperature {r.temperature}, "
                 f"{r.response_length or cfg.data.max_response_length} new tokens")
    built = engines.get("rollout")
    if built:
        lines[-1] += f"; built (read back): {built['rollout']} ({built['engine']})"
    return lines + inputs_lines(cfg)
