"""Shared pieces of the worker tests: tiny model folders, configs, batches and the PyTorch reference.

The reference is what the DeepSpeed workers must reproduce: one process, the same initial
weights (the same Hugging Face folder), the same loss functions from ``repro.rl.algorithms`` (and
the chunked log-probs of ``repro.workers.logprob``)
applied to the *whole* mini-batch (all dp ranks' samples at once), torch AdamW and torch's
grad-norm clipping.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from repro.batching.batch import padded_batch
from repro.config import DeepSpeedConfig, RunConfig
from repro.data.tiny_model import TOY_VOCAB, toy_qwen3_config
from repro.rl.algorithms import (
    agg_loss,
    compute_policy_loss,
    compute_value_loss,
    kl_penalty,
)
from repro.workers.logprob import token_log_probs
from tests.error_model import FP32_EPS, decoder_chain, fp32_tol  # noqa: F401 - re-exported to the worker tests

# ZeRO-3 keeps parameters below this many elements unpartitioned; 0 makes the tiny model's
# parameters really partitioned (as the large ones are on a real model).
ZERO3_PARTITION_ALL = {"zero_optimization": {"stage3_param_persistence_threshold": 0}}


def make_model_dir(path: str | os.PathLike, seed: int = 1234) -> str:
    """A tiny Qwen3 causal LM saved as a Hugging Face folder (fp32 safetensors)."""
    from transformers import Qwen3ForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file():
        torch.manual_seed(seed)
        Qwen3ForCausalLM(toy_qwen3_config()).float().save_pretrained(path, safe_serialization=True)
    return str(path)


def make_cfg(
    model_dir: str,
    *,
    world: int = 2,
    stage: int = 2,
    offload: str = "none",
    param_offload: bool = False,
    n: int = 2,
    train_batch_size: int = 4,
    mini: int = 2,
    micro: int | None = 2,
    dynamic: bool = False,
    max_tokens: int = 64,
    step_each_micro: bool = False,
    model_dtype: str = "float32",
    fp32_grad_accum: bool = False,
    loss_agg_mode: str = "token-mean",
    lr: float = 1e-2,
    grad_clip: float = 1.0,
    entropy_coeff: float = 0.0,
    use_kl_loss: bool = False,
    epochs: int = 1,
) -> RunConfig:
    """A RunConfig for the worker tests (fields set directly; no Hydra)."""
    cfg = RunConfig()
    cfg.trainer.n_gpus_per_node = world
    cfg.trainer.nnodes = 1
    cfg.data.train_batch_size = train_batch_size
    cfg.data.max_prompt_length = 6
    cfg.data.max_response_length = 6
    arr = cfg.actor_rollout_ref
    arr.model.path = model_dir
    arr.rollout.n = n
    arr.rollout.temperature = 1.0
    for section in (arr.actor, cfg.critic):
        section.ppo_mini_batch_size = mini
        section.ppo_micro_batch_size_per_gpu = None if dynamic else micro
        section.use_dynamic_bsz = dynamic
        section.ppo_max_token_len_per_gpu = max_tokens
        section.ppo_epochs = epochs
        section.loss_agg_mode = loss_agg_mode
        section.grad_clip = grad_clip
        section.optim.lr = lr
        section.optim.weight_decay = 0.01
    cfg.critic.forward_max_token_len_per_gpu = max_tokens
    cfg.critic.cliprange_value = 0.5
    cfg.critic.model.path = model_dir
    arr.actor.entropy_coeff = entropy_coeff
    arr.actor.use_kl_loss = use_kl_loss
    arr.actor.kl_loss_coef = 0.1
    arr.actor.clip_ratio_low = 0.2
    arr.actor.clip_ratio_high = 0.28
    ds = {
        "zero_stage": stage, "offload": offload, "param_offload": param_offload, "model_dtype": model_dtype,
        "fp32_grad_accum": fp32_grad_accum, "step_each_micro": step_each_micro, "torch_adam": True,
    }
    arr.actor.deepspeed = DeepSpeedConfig(**ds)
    arr.ref.deepspeed = DeepSpeedConfig(**ds)
    cfg.critic.deepspeed_config = DeepSpeedConfig(**ds)
    return cfg


def make_step_batch(seed: int, samples: int, prompt_len: int = 6, resp_len: int = 6,
                    empty_rows: tuple[int, ...] = ()) -> dict[str, torch.Tensor]:
    """A whole RL step's batch in verl's padded layout, with varied prompt/response lengths.

    ``empty_rows`` get a response of length 0 (no active tokens).
    """
    gen = torch.Generator().manual_seed(seed)
    p_lens = torch.randint(2, prompt_len + 1, (samples,), generator=gen)
    r_lens = torch.randint(1, resp_len + 1, (samples,), generator=gen)
    for row in empty_rows:
        r_lens[row] = 0
    prompt = torch.randint(1, TOY_VOCAB, (samples, prompt_len), generator=gen)
    prompt_mask = (torch.arange(prompt_len)[None] >= (prompt_len - p_lens)[:, None]).long()
    prompt = prompt * prompt_mask
    responses = torch.randint(1, TOY_VOCAB, (samples, resp_len), generator=gen)
    response_mask = (torch.arange(resp_len)[None] < r_lens[:, None]).long()
    responses = responses * response_mask
    fmask = response_mask.float()
    return {
        **padded_batch(prompt, prompt_mask, responses, response_mask),
        "old_log_probs": (-4.2 + 0.3 * torch.randn(samples, resp_len, generator=gen)) * fmask,
        "ref_log_prob": (-4.2 + 0.3 * torch.randn(samples, resp_len, generator=gen)) * fmask,
        "advantages": torch.randn(samples, resp_len, generator=gen) * fmask,
        "values": 0.1 * torch.randn(samples, resp_len, generator=gen) * fmask,
        "returns": torch.randn(samples, resp_len, generator=gen) * fmask,
    }


def shard(batch: dict[str, torch.Tensor], rank: int, world: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s contiguous share of a step's batch (what the driver hands it)."""
    size = batch["responses"].shape[0] // world
    return {k: v[rank * size:(rank + 1) * size].clone() for k, v in batch.items()}


def train_steps(worker, role: str, rank: int, world: int, steps: range, samples: int) -> list[dict]:
    """Update ``worker`` on step batches ``200 + step`` (this rank's share); metrics without ``perf/*``."""
    update = worker.update_policy if role == "actor" else worker.update_critic
    out = []
    for step in steps:
        metrics = update(shard(make_step_batch(200 + step, samples), rank, world))
        out.append({k: v for k, v in metrics.items() if not k.startswith("perf/")})
    return out


def global_mini_batches(batch: dict[str, torch.Tensor], world: int, per_rank_mini: int) -> list[dict]:
    """The samples of each mini-batch over all ranks (rank r's m-th mini-batch, for every r)."""
    shards = [shard(batch, r, world) for r in range(world)]
    per_rank = shards[0]["responses"].shape[0]
    out = []
    for start in range(0, per_rank, per_rank_mini):
        out.append({k: torch.cat([s[k][start:start + per_rank_mini] for s in shards]) for k in batch})
    return out


def params_of(worker) -> dict[str, torch.Tensor]:
    """Full parameters of a worker (collective at ZeRO-3), fp32 on CPU."""
    return {name: t.detach().float().cpu().clone() for name, t in worker.iter_full_weights()}


class Reference:
    """Single-process PyTorch training of the same losses on whole mini-batches."""

    def __init__(self, cfg: RunConfig, role: str) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

        self.cfg, self.role = cfg, role
        path = cfg.actor_rollout_ref.model.path
        if role == "actor":
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            section = cfg.actor_rollout_ref.actor
        else:
            config = AutoConfig.from_pretrained(path)
            config.num_labels, config.classifier_dropout = 1, 0.0
            torch.manual_seed(0)
            self.model = AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=torch.float32)
            section = cfg.critic
        self.section = section
        o = section.optim
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps,
                                     weight_decay=o.weight_decay)
        self.model.train()

    def set_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Start from given weights (the critic's score head is randomly initialised per process)."""
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                p.copy_(weights[name])

    def loss(self, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        a = self.section
        mask = mb["response_mask"].float()
        resp_len = mb["responses"].shape[1]
        if self.role == "critic":
            out = self.model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"],
                             position_ids=mb["position_ids"])
            vpreds = out.logits[:, -resp_len - 1:-1, 0]
            return compute_value_loss(vpreds, mb["returns"], mb["values"], mask, a.cliprange_value,
                                      a.loss_agg_mode).loss
        out = self.model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"],
                         position_ids=mb["position_ids"])
        logits = out.logits[:, -resp_len - 1:-1, :]
        # The workers' chunked log-probs (equal to log_softmax within 1e-6, gradients included:
        # tests/unit/workers/test_logprob.py). Their different fp32 rounding would otherwise reach
        # the weights through Adam, which turns gradient elements near eps into whole steps.
        log_prob, entropy = token_log_probs(logits, mb["responses"], with_entropy=bool(a.entropy_coeff))
        pg = compute_policy_loss(mb["old_log_probs"], log_prob, mb["advantages"], mask, a.clip_ratio_low,
                                 a.clip_ratio_high, a.clip_ratio_c, a.loss_agg_mode)
        loss = pg.loss
        if a.entropy_coeff:
            loss = loss - a.entropy_coeff * agg_loss(entropy, mask, a.loss_agg_mode)
        if a.use_kl_loss:
            kl = kl_penalty(log_prob, mb["ref_log_prob"], a.kl_loss_type)
            loss = loss + a.kl_loss_coef * agg_loss(kl, mask, a.loss_agg_mode)
        return loss

    def update(self, mini: dict[str, torch.Tensor]) -> tuple[float, float]:
        """One optimizer step on a whole mini-batch; returns (loss, pre-clip grad norm)."""
        self.opt.zero_grad()
        loss = self.loss(mini)
        loss.backward()
        clip = self.section.grad_clip
        params = list(self.model.parameters())
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        self.opt.step()
        return loss.item(), float(norm)

    def grads(self, mini: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Gradient of the whole mini-batch's loss (no step)."""
        self.opt.zero_grad()
        self.loss(mini).backward()
        return {n: p.grad.detach().clone() for n, p in self.model.named_parameters()}

    def params(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.model.named_parameters()}


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), (sorted(a.keys() ^ b.keys()))
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


# ---- Tolerances: an error model, not a number found by trial on one machine ----------------
# (tests/error_model.py states the model: n * eps * M for two summation orders of the same math.)
# Parity tests run AdamW with eps = lr. Adam's first step is lr * g / (|g| + eps): with the default
# eps (1e-8) a gradient of +-1e-12 (a pad position, a head bias: zero but for summation order)
# becomes a step of up to lr on one path and none on the other, so parameters after a step
# compare the CPU's summation order. With eps = lr the step's derivative in g is at most
# lr / eps = 1 (2 for later steps, whose m / sqrt(v) mixes past gradients): a gradient difference
# dg moves the parameters by at most 2 * dg per step. Gradients above eps are still normalised.
PARITY_ADAM_EPS_PER_LR = 1.0
ADAM_GAIN = 2.0  # max |d(update)/d(gradient)| per step with eps = lr


def toy_chain(seq_len: int, lora_rank: int = 0) -> int:
    """Accumulations along the longest path from the toy model's input to a log-prob or value."""
    return decoder_chain(toy_qwen3_config(), seq_len, lora_rank)


def forward_tol(seq_len: int, values: torch.Tensor) -> float:
    """Per-token log-probs, entropies or values of the toy model, ``values`` the reference's."""
    return fp32_tol(toy_chain(seq_len), values.abs().max())


def grad_tol(seq_len: int, tokens: int, grads: dict[str, torch.Tensor]) -> float:
    """Gradients of a loss over ``tokens`` tokens (each weight's gradient also sums over them)."""
    return fp32_tol(toy_chain(seq_len) + tokens, max(float(g.abs().max()) for g in grads.values()))


def full_grads(engine) -> dict[str, torch.Tensor]:
    """Every parameter's full gradient before the optimizer step (collective at ZeRO-3)."""
    from deepspeed.utils import safe_get_full_grad

    return {name: safe_get_full_grad(p).detach().float().cpu().clone()
            for name, p in engine.module.named_parameters() if p.requires_grad}
