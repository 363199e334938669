"""The policy worker: PPO/GRPO updates of the actor, and the frozen reference policy.

``ActorWorker(cfg, "actor")`` trains the policy on DeepSpeed (``actor_rollout_ref.actor``);
``ActorWorker(cfg, "ref")`` is the same model frozen (``actor_rollout_ref.ref``: a ZeRO-3
inference engine, or a plain module below ZeRO-3) that only gives reference log-probs.
Batches use verl's padded layout (``input_ids``/``attention_mask``/``position_ids`` ``[B, P+R]``,
``responses``/``response_mask`` ``[B, R]``, plus ``old_log_probs``, ``advantages`` and optionally
``ref_log_prob`` for updates); each rank gets its own shard.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from repro.algorithms import agg_loss, entropy_from_logits, kl_penalty, logprobs_from_logits
from repro.batching import plan_role_batch
from repro.config import RunConfig, resolve_env_knobs
from repro.distributed import init_distributed
from repro.policy_losses import compute_policy_loss_by_mode
from repro.workers import checkpoint
from repro.workers.batches import (
    Batch,
    batch_size,
    forward_micro_batches,
    mean_stats,
    plan_mini_batches,
    select,
)
from repro.workers.engine import RoleEngine, load_hf_model, memory_metrics, torch_dtype

logger = logging.getLogger(__name__)

ROLES = ("actor", "ref")


def check_inactive_skip(cfg: RunConfig, world_size: int) -> bool:
    """Whether the inactive-micro-batch shortcut is on; refuses it in multi-rank data parallel.

    Skipping backward for a micro-batch with no response tokens is a rank-local decision, so
    ranks stop issuing the same collectives: in the historical ZeRO-2 hang rank 0 skipped its
    backward and entered a 1-element all_reduce (the overflow check in ``step()``) while rank 1
    was in a 440467456-element gradient all_reduce of its backward.
    """
    actor = cfg.actor_rollout_ref.actor
    if not actor.skip_inactive_micro_batches:
        return False
    if world_size > 1:
        if not actor.unsafe_allow_skip_in_data_parallel:
            raise ValueError(
                f"actor_rollout_ref.actor.skip_inactive_micro_batches=True with {world_size} data-parallel ranks: "
                "a rank that skips a micro-batch's backward issues different collectives from its peers "
                "(the ZeRO-2 hang: rank 0 in a 1-element all_reduce, rank 1 in a 440467456-element gradient "
                "all_reduce). It is allowed only at world size 1; set "
                "actor_rollout_ref.actor.unsafe_allow_skip_in_data_parallel=True only to reproduce that hang."
            )
        logger.warning(
            "UNSAFE: skip_inactive_micro_batches in data parallel (world size %d): ranks will issue "
            "mismatched collectives and hang or crash; this exists to reproduce the ZeRO-2 hang",
            world_size,
        )
    return True


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
        self.skip_inactive = check_inactive_skip(cfg, self.world_size) if role == "actor" else False
        self.temperature = arr.rollout.temperature if arr.rollout.temperature > 0 else 1.0
        torch.manual_seed(cfg.trainer.seed)  # any weights new to the checkpoint init alike on every rank
        module = load_hf_model(arr.model, torch_dtype(self.ds))
        self.engine = RoleEngine(
            module, self.ds, self.plan,
            optim=arr.actor.optim if role == "actor" else None,
            grad_clip=arr.actor.grad_clip,
            ds_overrides=ds_overrides,
        )
        self.updates = 0
        """Update calls so far (seeds the between-epoch shuffle; saved in checkpoints)."""

    # ---- forward ---------------------------------------------------------------------------
    def _response_logits(self, mb: Batch) -> torch.Tensor:
        """Logits predicting each response token, ``[b, R, V]``, divided by the rollout temperature."""
        resp_len = mb["responses"].shape[1]
        out = self.engine.forward(
            input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=mb["position_ids"],
            use_cache=False, logits_to_keep=resp_len + 1,
        )
        return out.logits[:, :-1, :] / self.temperature

    def compute_log_prob(self, batch: Batch, calculate_entropy: bool = False) -> dict[str, torch.Tensor]:
        """Log-probs (and entropies) of the response tokens under the current weights."""
        rollout, ref = self.cfg.actor_rollout_ref.rollout, self.cfg.actor_rollout_ref.ref
        if self.role == "ref":
            micro, dynamic, budget = (ref.log_prob_micro_batch_size_per_gpu, ref.log_prob_use_dynamic_bsz,
                                      ref.log_prob_max_token_len_per_gpu)
        else:
            micro, dynamic, budget = (rollout.log_prob_micro_batch_size_per_gpu, rollout.log_prob_use_dynamic_bsz,
                                      rollout.log_prob_max_token_len_per_gpu)
        batch = self._to_device(batch)
        splits = forward_micro_batches(batch, micro or (None if dynamic else self.plan.micro),
                                       budget if dynamic else None)
        total = batch_size(batch)
        log_probs = torch.zeros(batch["responses"].shape, dtype=torch.float32, device=batch["responses"].device)
        entropy = torch.zeros_like(log_probs) if calculate_entropy else None
        with torch.no_grad():
            for idx in splits:
                mb = select(batch, idx)
                logits = self._response_logits(mb)
                rows = torch.as_tensor(idx, device=log_probs.device)
                log_probs[rows] = logprobs_from_logits(logits, mb["responses"])
                if entropy is not None:
                    entropy[rows] = entropy_from_logits(logits.float())
        assert sum(len(i) for i in splits) == total
        out = {"log_probs": log_probs.cpu()}
        if entropy is not None:
            out["entropy"] = entropy.cpu()
        return out

    def _to_device(self, batch: Batch) -> Batch:
        dev = self.engine.device
        return {k: v.to(dev) if torch.is_tensor(v) else v for k, v in batch.items()}

    # ---- update ----------------------------------------------------------------------------
    def update_policy(self, batch: Batch) -> dict[str, float]:
        """PPO epochs over this rank's shard: one optimizer update per mini-batch."""
        if self.role != "actor":
            raise ValueError("update_policy called on the frozen reference policy (role='ref')")
        a = self.acfg
        batch = self._to_device(batch)
        if a.use_kl_loss and "ref_log_prob" not in batch:
            raise ValueError("actor_rollout_ref.actor.use_kl_loss=True needs 'ref_log_prob' in the batch")
        seed = (a.data_loader_seed if a.data_loader_seed is not None else self.cfg.data.seed) + 7919 * self.updates
        minis = plan_mini_batches(
            batch, self.plan.per_rank_mini, a.ppo_epochs, shuffle=a.shuffle, seed=seed,
            micro=None if self.plan.dynamic else self.plan.micro,
            max_token_len=self.plan.max_token_len if self.plan.dynamic else None,
        )
        low = a.clip_ratio_low if a.clip_ratio_low is not None else a.clip_ratio
        high = a.clip_ratio_high if a.clip_ratio_high is not None else a.clip_ratio
        dp = float(self.world_size)
        results, token_weights = [], []
        for mini in minis:
            denoms = {"token_denominator": max(mini.global_tokens, 1.0), "seq_denominator": mini.global_seqs}

            def loss_fn(mb: Batch, denoms=denoms) -> tuple[torch.Tensor, dict[str, float]]:
                logits = self._response_logits(mb)
                mask = mb["response_mask"].to(torch.float32)
                log_prob = logprobs_from_logits(logits, mb["responses"])
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
                    entropy = entropy_from_logits(logits.float())
                    loss = loss - a.entropy_coeff * agg_loss(entropy, mask, a.loss_agg_mode, **denoms)
                    stats["actor/entropy"] = (entropy.detach() * mask).sum()
                if a.use_kl_loss:
                    kl = kl_penalty(log_prob, mb["ref_log_prob"].float(), a.kl_loss_type)
                    kl_loss = agg_loss(kl, mask, a.loss_agg_mode, **denoms)
                    loss = loss + a.kl_loss_coef * kl_loss
                    stats["actor/kl_loss"] = kl_loss.detach() * dp
                # DeepSpeed averages gradients over the dp ranks; the loss already divides by the
                # global count, so undo the average.
                return loss * dp, stats

            inactive = [float(mb["response_mask"].sum()) == 0 for mb in mini.micro_batches] if self.skip_inactive else None
            results.append(self.engine.train_mini_batch(mini.micro_batches, loss_fn, inactive))
            token_weights.append(mini.local_tokens)
        self.updates += 1
        return self._metrics(results, token_weights)

    def _metrics(self, results: list, token_weights: list[float]) -> dict[str, float]:
        per_update = []
        for res, tokens in zip(results, token_weights, strict=True):
            summed = {k: float(sum(s.get(k, 0.0) for s in res.stats)) for k in {k for s in res.stats for k in s}}
            for key in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl", "actor/entropy"):
                if key in summed:
                    summed[key] /= max(tokens, 1.0)
            per_update.append(summed)
        metrics = mean_stats(per_update)
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
        metrics.update(memory_metrics())
        return metrics

    # ---- weights and checkpoints ----------------------------------------------------------
    def iter_full_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights, one tensor at a time, with Hugging Face names (collective at ZeRO-3)."""
        return checkpoint.iter_full_weights(self.engine)

    def save_checkpoint(self, root: str, step: int, extra: dict) -> str:
        return checkpoint.save_worker(self, root, step, extra, keep=self.cfg.trainer.max_actor_ckpt_to_keep)

    def load_checkpoint(self, root: str) -> dict | None:
        return checkpoint.load_worker(self, root)

    def export_hf(self, out_dir: str) -> None:
        checkpoint.export_hf(self.engine, out_dir,
                             tokenizer_dir=checkpoint.tokenizer_dir(self.cfg.actor_rollout_ref.model))
