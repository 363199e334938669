"""The rules of a run config that span sections, checked once the dataclasses exist.

Batch plans per role, critic on/off, rollout engine, sequence parallelism, offload, paths,
no-effect keys, the skip-inactive guard, ZeRO-2 on one GPU; and the one fill of the LR schedule's
optimizer steps.
Problems are ``ValueError`` naming the full keys; harmless oddities are returned as notes (the
loader warns with them).
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
from typing import Any

from repro.batching.plan import ROLE_PREFIXES, BatchParams, RoleBatchPlan, plan_batch
from repro.config import NO_EFFECT_KEYS, RunConfig, critic_enabled, ref_policy_used
from repro.config.ds_config import resolve_offload
from repro.config.vllm import engine_kwargs as vllm_engine_kwargs
from repro.data.policies import NAMES, is_built_in

KNOWN_LOGGERS = ("console", "file")
# Rollout keys that the vLLM rollout would use; they only warn as no-effect with the hf rollout.
_VLLM_KEYS_PREFIX = "actor_rollout_ref.rollout."


def plan_role_batch(cfg: RunConfig, role: str) -> RoleBatchPlan:
    """The batch plan of ``role`` ("actor" or "critic"); each role uses its own ``ppo_*`` keys."""
    if role not in ROLE_PREFIXES:
        raise ValueError(f"role={role!r} is not valid; choose one of {list(ROLE_PREFIXES)}")
    section = cfg.actor_rollout_ref.actor if role == "actor" else cfg.critic
    return plan_batch(
        BatchParams(
            n_gpus_per_node=cfg.trainer.n_gpus_per_node,
            nnodes=cfg.trainer.nnodes,
            sp=section.ulysses_sequence_parallel_size,
            rollout_n=cfg.actor_rollout_ref.rollout.n,
            train_batch_size=cfg.data.train_batch_size,
            ppo_mini_batch_size=section.ppo_mini_batch_size,
            ppo_micro_batch_size_per_gpu=section.ppo_micro_batch_size_per_gpu,
            ppo_micro_batch_size=section.ppo_micro_batch_size,
            use_dynamic_bsz=section.use_dynamic_bsz,
            ppo_max_token_len_per_gpu=section.ppo_max_token_len_per_gpu,
            max_seq_len=cfg.data.max_prompt_length + cfg.data.max_response_length,
            prefix=ROLE_PREFIXES[role],
        )
    )


def compile_refusal(zero_stage: int) -> str | None:
    """Why decoder layers cannot be compiled under ``zero_stage`` in this environment, in one line; None when they can."""
    if zero_stage not in (0, 1, 2):
        return (f"zero_stage={zero_stage} is not valid; choose 0, 1 or 2 "
                "(ZeRO-3's per-module gather hooks would be traced)")
    if os.environ.get("TORCHDYNAMO_DISABLE") == "1":
        # torch.compile reads it when called and then returns the function unchanged, without a word
        return "TORCHDYNAMO_DISABLE=1 makes torch.compile do nothing; unset it"
    return None


def validate_run_config(cfg: RunConfig) -> list[str]:
    """Rules that span sections; raises ``ValueError`` naming keys, returns warnings."""
    notes: list[str] = []
    dry = cfg.trainer.dry_run
    arr = cfg.actor_rollout_ref
    use_critic = critic_enabled(cfg)

    sps = {arr.actor.ulysses_sequence_parallel_size, cfg.critic.ulysses_sequence_parallel_size if use_critic else 1}
    if len(sps - {1}) > 1:
        # DeepSpeed's SP groups (parallel_state_sp) are process-wide: one SP size per process.
        raise ValueError(
            f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={arr.actor.ulysses_sequence_parallel_size} and "
            f"critic.ulysses_sequence_parallel_size={cfg.critic.ulysses_sequence_parallel_size}: roles that use "
            "sequence parallelism must use the same size (or 1)"
        )

    if use_critic and cfg.critic.model.lora_rank:
        raise ValueError(f"critic.model.lora_rank={cfg.critic.model.lora_rank}: LoRA is implemented for the "
                         "actor only (actor_rollout_ref.model.lora_rank); set critic.model.lora_rank=0")

    if cfg.algorithm.adv_estimator == "gae" and cfg.critic.enable is False:
        raise ValueError(
            "algorithm.adv_estimator=gae needs a critic but critic.enable=False; "
            "set critic.enable=True or algorithm.adv_estimator=grpo"
        )
    if cfg.algorithm.adv_estimator == "grpo" and cfg.critic.enable:
        notes.append(
            "critic.enable=True with algorithm.adv_estimator=grpo: the critic is trained but GRPO "
            "advantages do not use its values"
        )
    if cfg.algorithm.adv_estimator == "grpo_passk" and arr.rollout.n < 2:
        raise ValueError(
            f"algorithm.adv_estimator=grpo_passk needs actor_rollout_ref.rollout.n >= 2 (it compares the best "
            f"two samples of each prompt), got {arr.rollout.n}"
        )
    if cfg.algorithm.adv_estimator == "grpo" and arr.rollout.n == 1:
        notes.append(
            "actor_rollout_ref.rollout.n=1 with algorithm.adv_estimator=grpo: each group has one "
            "sample, so (as in verl) its advantage is its raw score, without a baseline; use rollout.n >= 2"
        )

    plans = {role: plan_role_batch(cfg, role) for role in (("actor", "critic") if use_critic else ("actor",))}

    check_inactive_skip(cfg, cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes)

    if arr.rollout.tensor_model_parallel_size != 1:
        raise ValueError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={arr.rollout.tensor_model_parallel_size}:"
            " the hf and vllm rollouts run one replica per rank (colocated with its actor): set it to 1"
        )
    if arr.rollout.name == "vllm" and importlib.util.find_spec("vllm") is None:
        msg = (
            "actor_rollout_ref.rollout.name=vllm needs the vllm package (pip install 'repro[vllm]'), "
            "which is not installed; use actor_rollout_ref.rollout.name=hf"
        )
        if not dry:
            raise ValueError(msg)
        notes.append(msg + " (a real run fails here)")
    if arr.rollout.name == "vllm":
        vllm_engine_kwargs(cfg)  # refuses bad vLLM keys here, before any worker starts

    sections = [("actor_rollout_ref.actor.deepspeed", arr.actor.deepspeed)]
    if use_critic:
        sections.append(("critic.deepspeed_config", cfg.critic.deepspeed_config))
    if ref_policy_used(cfg):
        sections.append(("actor_rollout_ref.ref.deepspeed", arr.ref.deepspeed))
    for path, ds in sections:
        resolve_offload(ds.zero_stage, ds.offload, bool(ds.param_offload), ds.offload_dir, key=path)
    compiled = [("actor_rollout_ref.model", arr.model, *sections[0])]
    if ref_policy_used(cfg):
        compiled.append(("actor_rollout_ref.model", arr.model, "actor_rollout_ref.ref.deepspeed", arr.ref.deepspeed))
    if use_critic:
        compiled.append(("critic.model", cfg.critic.model, "critic.deepspeed_config", cfg.critic.deepspeed_config))
    for model_key, model, ds_key, ds in compiled:
        why = compile_refusal(ds.zero_stage) if model.compile_layers != "off" else None
        if why:
            raise ValueError(f"{model_key}.compile_layers={model.compile_layers} with {ds_key}.zero_stage="
                             f"{ds.zero_stage}: {why}")

    if cfg.trainer.resume_mode == "resume_path" and not cfg.trainer.resume_from_path:
        raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
    for name in cfg.trainer.logger:
        if name not in KNOWN_LOGGERS:
            notes.append(f"trainer.logger: {name!r} is ignored; repro logs to {list(KNOWN_LOGGERS)}")

    notes += _check_paths(cfg, use_critic, dry)
    notes += _no_effect_notes(cfg)
    notes += _log_prob_micro_notes(cfg, plans["actor"])
    updating = {"actor": sections[0]}  # the roles that update (the reference only forwards), as listed above
    if use_critic:
        updating["critic"] = sections[1]
    notes += _one_gpu_zero2_notes(plans, updating)
    return notes


def _one_gpu_zero2_notes(plans: dict[str, RoleBatchPlan], sections: dict[str, tuple[str, Any]]) -> list[str]:
    """ZeRO-2 on one GPU in all (with sequence parallelism DeepSpeed partitions over the SP ranks too) with more than one
    micro-batch an update: the stage partitions nothing there, yet DeepSpeed still runs its gradient hooks (bucket and
    partition copies, ~6 operators a parameter) after every micro-batch, where ZeRO-1 runs them once an update.
    Measured on one H100 at the 0.6B shape, four micro-batches an update: ZeRO-1 1.03-1.40x faster on three machines,
    0.96 GiB more allocated (results/actor_update/README.md, sessions 31-32). A note, not an error: the memory is the
    user's to weigh. ``sections``: each updating role's DeepSpeed section, as (its key, the dataclass)."""
    notes = []
    for role, (path, ds) in sections.items():
        plan = plans[role]
        if plan.world != 1 or ds.zero_stage != 2 or not (plan.dynamic or plan.gas > 1):
            continue
        split = "token-budget micro-batches" if plan.dynamic else f"{plan.gas} micro-batches an update"
        notes.append(
            f"{path}.zero_stage=2 on one GPU with {split}: ZeRO-2 partitions nothing on one rank but runs DeepSpeed's "
            f"gradient hooks after every micro-batch; {path}.zero_stage=1 runs them once an update (the 0.6B shape's "
            "update on one H100 at four micro-batches: 1.03-1.40x faster, about 1 GB more allocated)"
        )
    return notes


def _log_prob_micro_notes(cfg: RunConfig, update: RoleBatchPlan) -> list[str]:
    """A fixed log-prob micro-batch below the update's: the forward-only pass is cut finer than the update.

    A preset tuned for token budgets carries a nominal micro-batch of 1 (the budget decides); a user who
    turns the budgets off inherits it. Measured so on 4 H100s (results/4gpu/README.md): the seed's dp=2 x
    sp=2 keys with the log-prob pass at 1 sample a forward, 66% of the step against the update's 22%.
    """
    if update.dynamic:
        return []
    arr, notes = cfg.actor_rollout_ref, []
    sections = [("actor_rollout_ref.rollout", arr.rollout)]
    if ref_policy_used(cfg):
        sections.append(("actor_rollout_ref.ref", arr.ref))
    for path, section in sections:
        micro = section.log_prob_micro_batch_size_per_gpu
        if section.log_prob_use_dynamic_bsz or micro is None or micro >= update.micro:
            continue
        notes.append(
            f"{path}.log_prob_micro_batch_size_per_gpu={micro} with {path}.log_prob_use_dynamic_bsz=False: the "
            f"log-prob pass forwards {micro} sample(s) at a time while the update, which also keeps activations "
            f"for its backward, forwards {update.micro} (actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu); "
            f"set it to {update.micro} or more, or {path}.log_prob_use_dynamic_bsz=True"
        )
    return notes


def _check_paths(cfg: RunConfig, use_critic: bool, dry: bool) -> list[str]:
    """Model and data paths must exist for a real run; a dry run only warns (it loads nothing)."""
    problems = []
    models = [("actor_rollout_ref.model", cfg.actor_rollout_ref.model)]
    if use_critic:
        models.append(("critic.model", cfg.critic.model))
    for path, model in models:
        if not is_built_in(model.path) and not pathlib.Path(model.path).is_dir():
            problems.append(
                f"{path}.path={model.path!r} is not a local directory (models are not downloaded "
                f"here; use a local Hugging Face model directory or a built-in policy: {', '.join(NAMES)})"
            )
        if model.tokenizer_path and not pathlib.Path(model.tokenizer_path).is_dir():
            problems.append(f"{path}.tokenizer_path={model.tokenizer_path!r} is not a local directory")
    for key in ("train_files", "val_files"):
        value = getattr(cfg.data, key)
        files = [] if value is None else [value] if isinstance(value, str) else list(value)
        for f in files:
            if not pathlib.Path(str(f)).is_file():
                problems.append(
                    f"data.{key}: {str(f)!r} does not exist (leave it unset for the built-in arithmetic task)"
                )
    if problems and not dry:
        raise ValueError("; ".join(problems))
    return [p + " (a real run fails here)" for p in problems]


def _no_effect_notes(cfg: RunConfig) -> list[str]:
    defaults = RunConfig()
    notes = []
    for key, why in NO_EFFECT_KEYS.items():
        if cfg.actor_rollout_ref.rollout.name == "vllm" and key.startswith(_VLLM_KEYS_PREFIX):
            continue
        if _get(cfg, key) != _get(defaults, key):
            notes.append(f"{key}={_get(cfg, key)!r} has no effect here: {why}")
    return notes


def _get(obj: Any, key: str) -> Any:
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def check_inactive_skip(cfg: RunConfig, world_size: int) -> bool:
    """Whether the inactive-micro-batch shortcut is on; refuses it in multi-rank data parallel.

    Skipping backward for a micro-batch with no response tokens is a rank-local decision, so
    ranks stop issuing the same collectives: in the historical ZeRO-2 hang rank 0 skipped its
    backward and entered a 1-element all_reduce (the overflow check in ``step()``) while rank 1
    was in a 440467456-element gradient all_reduce of its backward. The driver checks the
    configured world size; each actor checks the one it really has.
    """
    actor = cfg.actor_rollout_ref.actor
    if not actor.skip_inactive_micro_batches:
        return False
    if world_size > 1 and not actor.unsafe_allow_skip_in_data_parallel:
        raise ValueError(
            f"actor_rollout_ref.actor.skip_inactive_micro_batches=True with {world_size} data-parallel ranks: "
            "a rank that skips a micro-batch's backward issues different collectives from its peers "
            "(the ZeRO-2 hang: rank 0 in a 1-element all_reduce, rank 1 in a 440467456-element gradient "
            "all_reduce). It is allowed only at world size 1; set "
            "actor_rollout_ref.actor.unsafe_allow_skip_in_data_parallel=True only to reproduce that hang."
        )
    return True


def fill_optimizer_steps(cfg: RunConfig, rl_steps: int | None = None) -> None:
    """LR-schedule optimizer steps = RL steps x ppo_epochs x mini-batches per step, unless set.

    ``rl_steps`` defaults to ``trainer.total_training_steps``; the trainer passes the count it
    derives from the data when that key is unset.
    """
    steps = cfg.trainer.total_training_steps if rl_steps is None else rl_steps
    if steps is None:
        return
    roles = [("actor", cfg.actor_rollout_ref.actor)]
    if critic_enabled(cfg):
        roles.append(("critic", cfg.critic))
    for role, section in roles:
        if section.optim.total_training_steps <= 0:
            plan = plan_role_batch(cfg, role)
            section.optim.total_training_steps = steps * section.ppo_epochs * plan.num_mini_batches
