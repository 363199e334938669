"""Driver-side RL operations on the rollout batch: rewards, the KL controller, batch metrics.

The rollout batch is a ``repro.batching.batch.Batch`` (cut into rank shards and joined again there).
The driver scores the decoded responses with the data source's rule reward and places each
score on the response's last real token, applies the in-reward KL penalty, and computes verl's
data and timing metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from repro.rl.algorithms import kl_penalty, masked_mean
from repro.rl.metrics import masked_stats


def decode_responses(tokenizer: Any, responses: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
    """Text of each response's real tokens (special tokens such as EOS dropped)."""
    lengths = response_mask.sum(dim=1).tolist()
    seqs = [row[: int(n)].tolist() for row, n in zip(responses, lengths, strict=True)]
    return tokenizer.batch_decode(seqs, skip_special_tokens=True)


def score_responses(
    texts: Sequence[str],
    data_sources: Sequence[str],
    ground_truths: Sequence[str],
    get_reward_fn: Callable[[str], Callable[..., float]],
    reward_kwargs: Mapping[str, Any],
    extra_infos: Sequence[Mapping[str, Any]] | None = None,
) -> torch.Tensor:
    """One float score per response from its data source's reward function; with ``extra_infos`` (the
    rows' ``extra_info``, one per response) each call also gets ``extra_info=`` (verl's reward plug-in)."""
    if extra_infos is None:
        scores = [float(get_reward_fn(src)(text, gt, **reward_kwargs))
                  for text, src, gt in zip(texts, data_sources, ground_truths, strict=True)]
    else:
        scores = [float(get_reward_fn(src)(text, gt, extra_info=dict(info), **reward_kwargs))
                  for text, src, gt, info in zip(texts, data_sources, ground_truths, extra_infos, strict=True)]
    return torch.tensor(scores, dtype=torch.float32)


def token_level_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``[B, R]`` zeros with each sequence score on its last real response token."""
    out = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = (response_mask.sum(dim=1) - 1).clamp(min=0).long()
    out[torch.arange(len(scores)), last] = scores
    return out


class KLController:
    """The in-reward KL coefficient: fixed, or adapted towards ``target_kl`` (proportional control)."""

    def __init__(self, kind: str, init_coef: float, target_kl: float, horizon: int) -> None:
        self.kind, self.value, self.target, self.horizon = kind, float(init_coef), target_kl, horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """One step of control; ``n_steps`` is the step's response count (verl's batch size)."""
        if self.kind != "adaptive":
            return
        # Error clipped to +-20% so one noisy batch cannot swing the coefficient.
        error = max(-0.2, min(0.2, current_kl / self.target - 1.0))
        self.value *= 1.0 + error * n_steps / self.horizon

    def state(self) -> dict[str, float]:
        return {"kl_coef": self.value}

    def load(self, state: Mapping[str, float]) -> None:
        self.value = float(state.get("kl_coef", self.value))


def apply_kl_penalty(batch: Mapping[str, torch.Tensor], kl_ctrl: KLController,
                     kind: str) -> tuple[torch.Tensor, dict[str, float]]:
    """Token rewards = scores - beta * KL(old, ref) on response tokens; then one controller step.

    The controller advances by the number of responses (``rollout.n`` per prompt), as verl's
    ``apply_kl_penalty`` does with its batch size; the metrics carry the beta that was applied.
    """
    mask = batch["response_mask"]
    kld = kl_penalty(batch["old_log_probs"], batch["ref_log_prob"], kind) * mask
    beta = kl_ctrl.value
    rewards = batch["token_level_scores"] - beta * kld
    current_kl = masked_mean(kld, mask, dim=-1).mean().item()
    kl_ctrl.update(current_kl, n_steps=mask.shape[0])
    return rewards, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def batch_metrics(batch: Mapping[str, torch.Tensor], scores: torch.Tensor, use_critic: bool) -> dict[str, float]:
    """verl's data metrics (``compute_data_metrics``): scores, rewards, advantages, returns, values, lengths.

    As in verl, an aborted (empty) response is left out of the score and reward statistics and of
    ``response_length_non_aborted/*``, and counted in ``response/aborted_ratio``; statistics over
    nothing are NaN. Lengths come from the attention mask split at the response width.
    """
    mask = batch["response_mask"]
    width = batch["responses"].shape[-1] if "responses" in batch else mask.shape[-1]
    attention = batch["attention_mask"]
    resp_len = attention[:, -width:].sum(dim=-1).float()
    prompt_len = attention[:, :-width].sum(dim=-1).float()
    kept = resp_len > 0
    nan = float("nan")
    out: dict[str, float] = {}
    out.update(masked_stats("critic/score", scores, kept, empty=nan))
    out.update(masked_stats("critic/rewards", batch["token_level_rewards"].sum(dim=1), kept, empty=nan))
    out.update(masked_stats("critic/advantages", batch["advantages"], mask, empty=nan))
    out.update(masked_stats("critic/returns", batch["returns"], mask, empty=nan))
    if use_critic:
        out.update(masked_stats("critic/values", batch["values"], mask, empty=nan))
        returns, values = batch["returns"][mask.bool()], batch["values"][mask.bool()]
        out["critic/vf_explained_var"] = (
            (1.0 - torch.var(returns - values) / (torch.var(returns) + 1e-5)).item() if returns.numel() else nan
        )
    out.update(masked_stats("response_length", resp_len))
    out["response_length/clip_ratio"] = (resp_len == width).float().mean().item()
    out.update(masked_stats("response_length_non_aborted", resp_len, kept, empty=nan))
    out["response_length_non_aborted/clip_ratio"] = (
        (resp_len[kept] == width).float().mean().item() if kept.any() else nan
    )
    out["response/aborted_ratio"] = (~kept).float().mean().item()
    out.update(masked_stats("prompt_length", prompt_len))
    out["prompt_length/clip_ratio"] = (prompt_len == attention.shape[-1] - width).float().mean().item()
    return out


# Sections timed per token as verl does: generation per response token, the rest per token overall.
_PER_TOKEN_SECTIONS = ("gen", "ref", "values", "adv", "update_critic", "update_actor")


def timing_per_token_ms(batch: Mapping[str, torch.Tensor], timings: Mapping[str, float]) -> dict[str, float]:
    """verl's ``timing_per_token_ms/<section>`` from ``timing_s/<section>`` (0 where no token)."""
    width = batch["responses"].shape[-1]
    attention = batch["attention_mask"]
    response_tokens = float(attention[:, -width:].sum())
    all_tokens = float(attention[:, :-width].sum()) + response_tokens
    out: dict[str, float] = {}
    for name in _PER_TOKEN_SECTIONS:
        seconds = timings.get(f"timing_s/{name}")
        if seconds is not None:
            tokens = response_tokens if name == "gen" else all_tokens
            out[f"timing_per_token_ms/{name}"] = seconds * 1000 / tokens if tokens > 0 else 0.0
    return out


def rollout_corr_metrics(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
                         response_mask: torch.Tensor) -> dict[str, float]:
    """How far the trainer's log-probs of the rollout's own samples are from the rollout's.

    With exact weights in both engines the only difference is arithmetic (bf16 kernels, reduction
    order), so these stay near 0; a rollout left with stale weights or a wrong temperature moves
    them by orders of magnitude. Names follow verl's ``rollout_corr/*`` where verl has them, over
    response tokens, samples drawn from the rollout policy:

    - ``rollout_corr/kl``: mean of ``log p_rollout - log p_train``, the direct estimate of
      KL(rollout || train) (can be slightly negative per batch);
    - ``rollout_corr/k3_kl``: mean of ``r - 1 - log r`` with ``r = p_train / p_rollout``, the
      non-negative estimate of the same KL (NeMo-RL holds this kind of error below 1e-3);
    - ``rollout_corr/log_prob_abs_diff_max``: the largest per-token disagreement (repro's own);
    - ``rollout_corr/training_ppl`` / ``rollout_corr/rollout_ppl``: exp of minus the mean log-prob.
    """
    mask = response_mask.bool()
    train, roll = old_log_probs.float()[mask], rollout_log_probs.float()[mask]
    if not train.numel():
        return {}
    log_ratio = train - roll
    return {
        "rollout_corr/kl": (-log_ratio).mean().item(),
        "rollout_corr/k3_kl": (torch.expm1(log_ratio) - log_ratio).mean().item(),
        "rollout_corr/log_prob_abs_diff_max": log_ratio.abs().max().item(),
        "rollout_corr/training_ppl": torch.exp(-train.mean()).item(),
        "rollout_corr/rollout_ppl": torch.exp(-roll.mean()).item(),
    }
