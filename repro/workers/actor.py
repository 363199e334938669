"""The policy worker: PPO/GRPO updates of the actor, and the frozen reference policy.

``ActorWorker(cfg, "actor")`` trains the policy on DeepSpeed (``actor_rollout_ref.actor``);
``ActorWorker(cfg, "ref")`` is the same model frozen (``actor_rollout_ref.ref``: a ZeRO-3
inference engine, or a plain module below ZeRO-3) that only gives reference log-probs.
Batches use verl's padded layout (``input_ids``/``attention_mask``/``position_ids`` ``[B, P+R]``,
``responses``/``response_mask`` ``[B, R]``, plus ``old_log_probs``, ``advantages`` and optionally
``ref_log_prob`` for updates); each rank gets its own shard.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from repro.batching.batch import Batch, host_view, num_samples, pad_responses, select, trimmed
from repro.cluster.process_group import init_distributed
from repro.config import RunConfig, resolve_env_knobs
from repro.config.rules import check_inactive_skip, plan_role_batch
from repro.rl.algorithms import agg_loss, kl_penalty
from repro.rl.policy_losses import compute_policy_loss_by_mode
from repro.workers import activation_checkpointing, checkpoint, layer_compile, lora, ulysses, varlen
from repro.workers.engine import RoleEngine, load_hf_model, memory_metrics, torch_dtype
from repro.workers.logprob import token_log_probs
from repro.workers.mini_batches import forward_micro_batches, mean_update_stats, update_mini_batches
from repro.workers.packing import pack

logger = logging.getLogger(__name__)

ROLES = ("actor", "ref")


def inactive_skip_on(cfg: RunConfig, world_size: int) -> bool:
    """``check_inactive_skip`` on this rank's real world size, with a warning when it is the unsafe case."""
    on = check_inactive_skip(cfg, world_size)
    if on and world_size > 1:
        logger.warning(
            "UNSAFE: skip_inactive_micro_batches in data parallel (world size %d): ranks will issue "
            "mismatched collectives and hang or crash; this exists to reproduce the ZeRO-2 hang",
            world_size,
        )
    return on


class ActorWorker:
    """Actor (trainable) or reference (frozen) policy of one rank."""

    def __init__(self, cfg: RunConfig, role: str = "actor", *, ds_overrides: dict[str, Any] | None = None) -> None:
        if role not in ROLES:
            raise ValueError(f"ActorWorker role={role!r} is not valid; choose one of {list(ROLES)}")
        init_distributed()
        self.cfg = cfg
        self.role = role
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        arr = cfg.actor_rollout_ref
        self.acfg = arr.actor
        self.ds = resolve_env_knobs(arr.actor.deepspeed if role == "actor" else arr.ref.deepspeed)
        self.plan = plan_role_batch(cfg, "actor")
        self.skip_inactive = inactive_skip_on(cfg, self.world_size) if role == "actor" else False
        self.temperature = arr.rollout.temperature if arr.rollout.temperature > 0 else 1.0
        self.remove_padding = bool(arr.model.use_remove_padding)
        torch.manual_seed(cfg.trainer.seed)  # any weights new to the checkpoint init alike on every rank
        module = load_hf_model(arr.model, torch_dtype(self.ds))
        self.sp = arr.actor.ulysses_sequence_parallel_size
        mpu = ulysses.enable(module, self.sp, role) if self.sp > 1 else None
        self.varlen = varlen.engage(module, arr.model.flash_attention, torch_dtype(self.ds),
                                    packed_rows=self.remove_padding and self.sp == 1)
        if role == "actor" and lora.enabled(arr.model):
            module = lora.wrap(module, arr.model)
        self.engine = RoleEngine(
            module, self.ds, self.plan,
            optim=arr.actor.optim if role == "actor" else None,
            grad_clip=arr.actor.grad_clip,
            ds_overrides=ds_overrides, mpu=mpu,
        )
        layer_compile.from_config(self.engine.module, arr.model.compile_layers, self.ds.zero_stage,
                                  arr.model.compile_scope)
        if role == "actor":  # the reference never trains
            activation_checkpointing.arm(self.engine, self.plan, arr.model, cfg.data)
        self.updates = 0
        """Update calls so far (seeds the between-epoch shuffle; saved in checkpoints)."""

    # ---- forward ---------------------------------------------------------------------------
    def _log_probs(self, mb: Batch, *, with_entropy: bool,
                   capacity: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of the response tokens under ``softmax(logits / T)``, ``[b, R]``.

        Computed in chunks (:mod:`repro.workers.logprob`); with ``use_remove_padding`` the forward
        runs on the micro-batch's real tokens packed into rows of ``capacity`` tokens, with
        sequence parallelism on this rank's slice of the sequence (:mod:`repro.workers.ulysses`).
        """
        resp_len = mb["responses"].shape[1]
        if not self.remove_padding and self.sp == 1:
            t = trimmed(mb)  # the columns some row holds a token in; zeros elsewhere, as the packed paths give
            logits = self.engine.forward(
                input_ids=t["input_ids"], attention_mask=t["attention_mask"], position_ids=t["position_ids"],
                use_cache=False, logits_to_keep=t["responses"].shape[1] + 1,
            ).logits[:, :-1]
            log_prob, entropy = token_log_probs(logits, t["responses"], temperature=self.temperature,
                                                with_entropy=with_entropy)
            log_prob = pad_responses(log_prob * t["response_mask"], resp_len)
            return log_prob, (pad_responses(entropy * t["response_mask"], resp_len) if entropy is not None else None)
        # the index math from the masks' host copies: no wait for the device between micro-batches
        packed = pack(mb["input_ids"], host_view(mb, "attention_mask"), mb["position_ids"], capacity,
                      one_row=self.varlen) if self.remove_padding else None
        if packed is not None and self.sp == 1:
            # logits only where a response token is predicted, as the padded path's logits_to_keep
            slots = packed.response_slots(host_view(mb, "response_mask"))
            bounds = varlen.host_boundaries(packed.host_positions(host_view(mb, "position_ids")),
                                            packed.input_ids.device) if self.varlen else {}
            logits = self.engine.forward(input_ids=packed.input_ids, position_ids=packed.position_ids,
                                         use_cache=False, logits_to_keep=slots.columns, **bounds).logits
            log_prob, entropy = token_log_probs(logits, packed.next_token[:, slots.columns],
                                                temperature=self.temperature, with_entropy=with_entropy)
            return slots.scatter(log_prob), (slots.scatter(entropy) if entropy is not None else None)
        ids, pos = (packed.input_ids, packed.position_ids) if packed else (mb["input_ids"], mb["position_ids"])
        log_prob, entropy = ulysses.token_forward(
            self.engine.forward, ids, pos, self.sp,
            lambda out, labels: token_log_probs(out.logits, labels, temperature=self.temperature,
                                                with_entropy=with_entropy))
        # Padded position j predicts token j + 1: response token t is predicted at P + t - 1.
        # Positions off the response mask may hold another sample's token: zero them.
        mask = mb["response_mask"].to(log_prob.dtype)
        padded = packed.unpack if packed else (lambda t: t)
        log_prob = padded(log_prob)[:, -resp_len - 1:-1] * mask
        if entropy is not None:
            entropy = padded(entropy)[:, -resp_len - 1:-1] * mask
        return log_prob, entropy

    def compute_log_prob(self, batch: Batch, calculate_entropy: bool = False, *,
                         without_adapters: bool = False) -> dict[str, torch.Tensor]:
        """Log-probs (and entropies) of the response tokens under the current weights.

        ``without_adapters``: under the base model of a LoRA actor (the reference policy of a
        LoRA run, which therefore needs no copy of its own); the actor's rollout micro-batching.
        """
        rollout, ref = self.cfg.actor_rollout_ref.rollout, self.cfg.actor_rollout_ref.ref
        if self.role == "ref":
            micro, dynamic, budget = (ref.log_prob_micro_batch_size_per_gpu, ref.log_prob_use_dynamic_bsz,
                                      ref.log_prob_max_token_len_per_gpu)
        else:
            micro, dynamic, budget = (rollout.log_prob_micro_batch_size_per_gpu, rollout.log_prob_use_dynamic_bsz,
                                      rollout.log_prob_max_token_len_per_gpu)
        batch = ulysses.rank_batch(batch, self.sp, self.engine.device)
        if self.sp > 1:
            budget *= self.sp  # an SP group forwards its ranks' samples together (verl's scaling)
        splits = forward_micro_batches(batch, micro or (None if dynamic else self.plan.micro),
                                       budget if dynamic else None)
        total = num_samples(batch)
        log_probs = torch.zeros(batch["responses"].shape, dtype=torch.float32, device=batch["responses"].device)
        entropy = torch.zeros_like(log_probs) if calculate_entropy else None
        base = lora.adapters_disabled(self.engine.module) if without_adapters else contextlib.nullcontext()
        with torch.no_grad(), base:
            for idx in splits:
                mb = select(batch, idx)
                lp, ent = self._log_probs(mb, with_entropy=calculate_entropy, capacity=budget if dynamic else None)
                rows = torch.as_tensor(idx).to(log_probs.device, non_blocking=True)  # no device wait
                log_probs[rows] = lp.float()
                if entropy is not None:
                    entropy[rows] = ent.float()
        assert sum(len(i) for i in splits) == total
        out = {"log_probs": log_probs, **({"entropy": entropy} if entropy is not None else {})}
        return {k: (ulysses.own_rows(v, self.sp) if self.sp > 1 else v).cpu() for k, v in out.items()}

    # ---- update ----------------------------------------------------------------------------
    def update_policy(self, batch: Batch) -> dict[str, float]:
        """PPO epochs over this rank's shard: one optimizer update per mini-batch."""
        if self.role != "actor":
            raise ValueError("update_policy called on the frozen reference policy (role='ref')")
        a = self.acfg
        batch = ulysses.rank_batch(batch, self.sp, self.engine.device)
        if a.use_kl_loss and "ref_log_prob" not in batch:
            raise ValueError("actor_rollout_ref.actor.use_kl_loss=True needs 'ref_log_prob' in the batch")
        minis = update_mini_batches(batch, self.plan, a, self.cfg.data.seed, self.updates, self.sp)
        low = a.clip_ratio_low if a.clip_ratio_low is not None else a.clip_ratio
        high = a.clip_ratio_high if a.clip_ratio_high is not None else a.clip_ratio
        dp = float(self.world_size // self.sp)
        capacity = self.plan.max_token_len if self.plan.dynamic else None
        results, token_weights = [], []
        self.engine.arm_fault(self.updates + 1)  # REPRO_FAULT_RANK (repro.workers.faults), fired by the engine
        for mini in minis:
            denoms = {"token_denominator": max(mini.global_tokens, 1.0), "seq_denominator": mini.global_seqs,
                      "loss_scale_factor": a.loss_scale_factor}

            def loss_fn(mb: Batch, denoms=denoms) -> tuple[torch.Tensor, dict[str, float]]:
                mask = mb["response_mask"].to(torch.float32)
                log_prob, entropy = self._log_probs(mb, with_entropy=a.entropy_coeff != 0, capacity=capacity)
                pg = compute_policy_loss_by_mode(a.policy_loss.loss_mode, mb["old_log_probs"].float(), log_prob,
                                                 mb["advantages"].float(), mask, low=low, high=high,
                                                 clip_ratio_c=a.clip_ratio_c, loss_agg_mode=a.loss_agg_mode,
                                                 params=a.policy_loss, **denoms)
                loss = pg.loss
                # Statistics stay tensors (no device sync per micro-batch); read once per update.
                tokens = mask.sum()
                stats = {
                    "actor/pg_loss": pg.loss.detach() * dp,
                    "actor/pg_clipfrac": pg.clipfrac * tokens,
                    "actor/pg_clipfrac_lower": pg.clipfrac_lower * tokens,
                    "actor/ppo_kl": pg.ppo_kl.detach() * tokens,
                }
                if a.entropy_coeff != 0:
                    # Without an entropy bonus the trainer reports entropy from compute_log_prob.
                    entropy_loss = agg_loss(entropy, mask, a.loss_agg_mode, **denoms)
                    loss = loss - a.entropy_coeff * entropy_loss
                    stats["actor/entropy"] = (entropy.detach() * mask).sum()
                    stats["actor/entropy_loss"] = entropy_loss.detach() * dp  # verl's name for the bonus term
                if a.use_kl_loss:
                    kl = kl_penalty(log_prob, mb["ref_log_prob"].float(), a.kl_loss_type)
                    kl_loss = agg_loss(kl, mask, a.loss_agg_mode, **denoms)
                    loss = loss + a.kl_loss_coef * kl_loss
                    stats["actor/kl_loss"] = kl_loss.detach() * dp
                # DeepSpeed averages gradients over the dp ranks (and sums the SP ranks' parts); the
                # loss already divides by the global count, so undo the average.
                return loss * dp, stats

            inactive = [float(host_view(mb, "response_mask").sum()) == 0 for mb in mini.micro_batches] if self.skip_inactive else None
            results.append(self.engine.train_mini_batch(mini.micro_batches, loss_fn, inactive))
            token_weights.append(mini.local_tokens)
        self.updates += 1
        return self._metrics(results, token_weights)

    def _metrics(self, results: list, token_weights: list[float]) -> dict[str, float]:
        metrics = mean_update_stats([r.stats for r in results], token_weights,
                                    ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl", "actor/entropy"))
        if self.acfg.use_kl_loss:
            metrics["actor/kl_coef"] = self.acfg.kl_loss_coef
        applied = [r for r in results if not r.skipped]
        norms = [r.grad_norm for r in applied]
        metrics["actor/grad_norm"] = sum(norms) / len(norms) if norms else float("nan")
        metrics["actor/lr"] = results[-1].lr if results else self.engine.current_lr()
        metrics["actor/skipped_steps"] = float(len(results) - len(applied))
        metrics["actor/num_updates"] = float(len(results))
        if self.skip_inactive:
            metrics["actor/inactive_micro_batches_skipped"] = float(sum(r.micro_batches_skipped for r in results))
        metrics.update(self.engine.checkpointing_metrics("actor"))
        metrics.update(memory_metrics())
        return metrics

    # ---- weights and checkpoints ----------------------------------------------------------
    def iter_full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights, one tensor at a time, with Hugging Face names (collective at ZeRO-3)."""
        return checkpoint.iter_full_weights(self.engine)

    def save_checkpoint(self, path: str, step: int, extra: dict) -> str:
        """One checkpoint into the folder ``path`` (every rank calls it); the step series is the driver's."""
        return checkpoint.save_worker(self, path, step, extra, model=self.cfg.actor_rollout_ref.model,
                                      contents=self.cfg.actor_rollout_ref.actor.checkpoint.save_contents)

    def load_checkpoint(self, path: str) -> dict:
        return checkpoint.load_worker(self, path)

    def export_hf(self, out_dir: str) -> None:
        checkpoint.export_hf(self.engine, out_dir,
                             tokenizer_dir=checkpoint.tokenizer_dir(self.cfg.actor_rollout_ref.model))

    def export_lora_adapter(self, out_dir: str) -> None:
        """A peft adapter folder of a LoRA actor (load with ``PeftModel.from_pretrained``); all ranks call."""
        if not lora.is_lora(self.engine.module):
            raise ValueError("export_lora_adapter needs actor_rollout_ref.model.lora_rank > 0")
        lora.save_adapter(self.engine.module, out_dir, self.ds.zero_stage == 3, self.rank == 0)
        dist.barrier()
