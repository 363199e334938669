"""The value worker of PPO: ``compute_values`` and clipped value-loss updates on DeepSpeed.

The value model is ``AutoModelForTokenClassification`` with one output on the policy's
backbone (``critic.model.path``): the value of the state before response token ``t`` is read at
the position that predicts token ``t``, as the actor reads its logits. It saves, reloads and
exports as an ordinary Hugging Face model.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from repro.batching.batch import Batch, host_view, num_samples, pad_responses, select, trimmed
from repro.cluster.process_group import init_distributed
from repro.config import RunConfig, resolve_env_knobs
from repro.config.rules import plan_role_batch
from repro.rl.algorithms import compute_value_loss, masked_mean
from repro.workers import activation_checkpointing, checkpoint, layer_compile, ulysses, varlen
from repro.workers.engine import RoleEngine, load_hf_model, memory_metrics, torch_dtype
from repro.workers.mini_batches import forward_micro_batches, mean_update_stats, update_mini_batches
from repro.workers.packing import pack


class CriticWorker:
    """The critic of one rank."""

    def __init__(self, cfg: RunConfig, *, ds_overrides: dict[str, Any] | None = None) -> None:
        init_distributed()
        self.cfg = cfg
        self.ccfg = cfg.critic
        self.world_size = dist.get_world_size()
        self.ds = resolve_env_knobs(cfg.critic.deepspeed_config)
        self.plan = plan_role_batch(cfg, "critic")
        model_cfg = cfg.critic.model
        self.remove_padding = bool(model_cfg.use_remove_padding)
        torch.manual_seed(cfg.trainer.seed)  # same value-head init on every rank and run
        module = load_hf_model(model_cfg, torch_dtype(self.ds), value_head=True)
        self.sp = cfg.critic.ulysses_sequence_parallel_size
        varlen.activate(model_cfg.flash_attention, torch_dtype(self.ds))
        mpu = ulysses.enable(module, self.sp, "critic") if self.sp > 1 else None
        self.engine = RoleEngine(module, self.ds, self.plan, optim=cfg.critic.optim,
                                 grad_clip=cfg.critic.grad_clip, ds_overrides=ds_overrides, mpu=mpu)
        layer_compile.from_config(self.engine.module, model_cfg.compile_layers, self.ds.zero_stage,
                                  model_cfg.compile_scope)
        activation_checkpointing.arm(self.engine, self.plan, model_cfg, cfg.data)
        self.updates = 0

    def _values(self, mb: Batch, capacity: int | None = None) -> torch.Tensor:
        """Values predicting each response token, ``[b, R]``; packed rows of ``capacity`` tokens
        with ``use_remove_padding`` (:mod:`repro.workers.packing`), this rank's slice of the
        sequence with sequence parallelism (:mod:`repro.workers.ulysses`)."""
        resp_len = mb["responses"].shape[1]
        if not self.remove_padding and self.sp == 1:
            t = trimmed(mb)  # the columns some row holds a token in (repro.batching.batch.trimmed)
            out = self.engine.forward(input_ids=t["input_ids"], attention_mask=t["attention_mask"],
                                      position_ids=t["position_ids"], use_cache=False)
            keep = t["responses"].shape[1]
            return pad_responses(out.logits[:, -keep - 1:-1, 0].float() * t["response_mask"], resp_len)
        packed = pack(mb["input_ids"], host_view(mb, "attention_mask"), mb["position_ids"], capacity) \
            if self.remove_padding else None  # the mask's host copy: no wait for the device
        ids, pos = (packed.input_ids, packed.position_ids) if packed else (mb["input_ids"], mb["position_ids"])
        (values,) = ulysses.token_forward(self.engine.forward, ids, pos, self.sp,
                                          lambda out, labels: (out.logits[..., 0].float(),))
        values = packed.unpack(values) if packed else values
        return values[:, -resp_len - 1:-1] * mb["response_mask"]

    def compute_values(self, batch: Batch) -> dict[str, torch.Tensor]:
        """Values of the response positions, zero on padding, ``[B, R]``."""
        c = self.ccfg
        batch = ulysses.rank_batch(batch, self.sp, self.engine.device)
        micro = c.forward_micro_batch_size_per_gpu or c.ppo_micro_batch_size_per_gpu or None
        budget = c.forward_max_token_len_per_gpu * self.sp if c.use_dynamic_bsz else None
        splits = forward_micro_batches(batch, micro, budget)
        values = torch.zeros(batch["responses"].shape, dtype=torch.float32, device=batch["responses"].device)
        with torch.no_grad():
            for idx in splits:
                mb = select(batch, idx)
                rows = torch.as_tensor(idx).to(values.device, non_blocking=True)  # no device wait
                values[rows] = self._values(mb, budget) * mb["response_mask"]
        assert sum(len(i) for i in splits) == num_samples(batch)
        return {"values": (ulysses.own_rows(values, self.sp) if self.sp > 1 else values).cpu()}

    def update_critic(self, batch: Batch) -> dict[str, float]:
        """PPO epochs of clipped value-loss updates: one optimizer update per mini-batch."""
        c = self.ccfg
        batch = ulysses.rank_batch(batch, self.sp, self.engine.device)
        minis = update_mini_batches(batch, self.plan, c, self.cfg.data.seed, self.updates, self.sp)
        dp = float(self.world_size // self.sp)
        capacity = self.plan.max_token_len if self.plan.dynamic else None
        results, weights = [], []
        for mini in minis:
            denoms = {"token_denominator": max(mini.global_tokens, 1.0), "seq_denominator": mini.global_seqs,
                      "loss_scale_factor": c.loss_scale_factor}

            def loss_fn(mb: Batch, denoms=denoms) -> tuple[torch.Tensor, dict[str, float]]:
                mask = mb["response_mask"].to(torch.float32)
                vpreds = self._values(mb, capacity)
                vf = compute_value_loss(vpreds, mb["returns"].float(), mb["values"].float(), mask,
                                        c.cliprange_value, c.loss_agg_mode, **denoms)
                tokens = mask.sum()
                stats = {  # tensors: read once per update, not once per micro-batch
                    "critic/vf_loss": vf.loss.detach() * dp,
                    "critic/vf_clipfrac": vf.clipfrac * tokens,
                    "critic/vpred_mean": masked_mean(vpreds.detach(), mask) * tokens,
                }
                return vf.loss * dp, stats

            results.append(self.engine.train_mini_batch(mini.micro_batches, loss_fn))
            weights.append(mini.local_tokens)
        self.updates += 1
        metrics = mean_update_stats([r.stats for r in results], weights, ("critic/vf_clipfrac", "critic/vpred_mean"))
        applied = [r for r in results if not r.skipped]
        metrics["critic/grad_norm"] = sum(r.grad_norm for r in applied) / len(applied) if applied else float("nan")
        metrics["critic/lr"] = results[-1].lr
        metrics["critic/skipped_steps"] = float(len(results) - len(applied))
        metrics.update(self.engine.checkpointing_metrics("critic"))
        metrics.update(memory_metrics())
        return metrics

    def iter_full_weights(self):
        return checkpoint.iter_full_weights(self.engine)

    def save_checkpoint(self, path: str, step: int, extra: dict) -> str:
        """One checkpoint into the folder ``path`` (every rank calls it); the step series is the driver's."""
        return checkpoint.save_worker(self, path, step, extra, model=self.ccfg.model,
                                      contents=self.ccfg.checkpoint.save_contents)

    def load_checkpoint(self, path: str) -> dict:
        return checkpoint.load_worker(self, path)

    def export_hf(self, out_dir: str) -> None:
        checkpoint.export_hf(self.engine, out_dir, tokenizer_dir=checkpoint.tokenizer_dir(self.ccfg.model))
