"""Reference rollout: transformers ``generate`` on an inference copy of the policy.

The copy lives in the same process as the rank's ``ActorWorker`` and is refreshed every step
from ``ActorWorker.iter_full_weights()`` (gathered full tensors, so ZeRO-3 shards work too).
Sampling (temperature, top-p, top-k, ``n`` per prompt) is seeded per call: the caller passes a
seed derived from (run seed, step, rank), and the draw runs inside a forked RNG so the worker's
own random state is not touched. A run that resumes therefore samples exactly what the
uninterrupted run sampled.

Output: verl's padded batch layout (interfaces.md): prompts left-padded to ``prompt_pad_to``,
responses right-padded to ``response_length``; a response ends at its first EOS, which is kept
and counted in ``response_mask``; everything after it is padding.

:func:`make_rollout` picks the rollout: ``rollout.name=vllm`` gives the vLLM adapter
(``rollout_vllm``, same interface and layout), or a clear error when vllm is not installed.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from repro.batching.batch import Batch
from repro.config import RunConfig
from repro.config import sampling as rollout_sampling
from repro.devices import default_device
from repro.workers import rollout_layout as layout

if TYPE_CHECKING:
    from repro.workers.rollout_vllm import VLLMRollout


def _model_dtype(cfg: RunConfig, device: torch.device) -> torch.dtype:
    dtype = cfg.actor_rollout_ref.actor.deepspeed.model_dtype
    if dtype == "bfloat16" or (dtype == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return torch.float32


def make_rollout(cfg: RunConfig, device: torch.device | None = None) -> HFRollout | VLLMRollout:
    """The rollout named by ``actor_rollout_ref.rollout.name``."""
    name = cfg.actor_rollout_ref.rollout.name
    if name == "hf":
        return HFRollout(cfg, device=device)
    if name == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise ValueError(
                "actor_rollout_ref.rollout.name=vllm needs the vllm package, which is not installed; "
                "use actor_rollout_ref.rollout.name=hf (the reference rollout)"
            )
        from repro.workers.rollout_vllm import VLLMRollout

        return VLLMRollout(cfg, device=device)
    raise ValueError(f"actor_rollout_ref.rollout.name={name!r} is not valid; choose one of ['hf', 'vllm']")


def _decode_attention(device: torch.device) -> contextlib.AbstractContextManager:
    """SDPA without its cuDNN backend on CUDA: decode meets a new key length every token.

    cuDNN builds an attention plan per new shape; a generate call of 128 new tokens meets 128 of
    them, and each prompt width brings more. Measured on one H100 (Qwen3-0.6B shape, batch 128,
    ``results/peers/README.md``): 134-210 ms per decode step with cuDNN on shapes it had not met,
    57-64 ms on shapes it had, 47-63 ms for flash/memory-efficient attention either way.
    """
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


class HFRollout:
    """Sampling with ``model.generate`` on a private copy of the policy."""

    def __init__(self, cfg: RunConfig, device: torch.device | None = None) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        from repro.data.tokenizer import load_tokenizer

        model_cfg = cfg.actor_rollout_ref.model
        rollout = cfg.actor_rollout_ref.rollout
        if rollout.tensor_model_parallel_size != 1:
            raise ValueError(
                f"actor_rollout_ref.rollout.tensor_model_parallel_size={rollout.tensor_model_parallel_size}: "
                "the hf rollout runs on one device per rank; set it to 1"
            )
        path = Path(model_cfg.path)
        if not (path / "config.json").is_file():
            raise ValueError(f"actor_rollout_ref.model.path={model_cfg.path!r} has no config.json")
        self.cfg = cfg
        self.device = device or default_device()
        self.tokenizer = load_tokenizer(model_cfg.tokenizer_path or model_cfg.path, model_cfg.trust_remote_code)
        hf_config = AutoConfig.from_pretrained(model_cfg.path, trust_remote_code=model_cfg.trust_remote_code)
        for key, value in model_cfg.override_config.items():
            setattr(hf_config, key, value)
        # Weights arrive from the actor before every generation; the initial values do not matter.
        with torch.device(self.device):
            self.model = AutoModelForCausalLM.from_config(
                hf_config, dtype=_model_dtype(cfg, self.device), trust_remote_code=model_cfg.trust_remote_code
            )
        self.model.eval()
        self.model.requires_grad_(False)
        self.pad_id = self.tokenizer.pad_token_id
        self.eos_id = self.tokenizer.eos_token_id
        if self.pad_id is None:
            self.pad_id = self.eos_id
        if self.eos_id is None:
            raise ValueError(f"tokenizer of {model_cfg.path} has no eos_token; the rollout needs one to stop")
        self.weights_version = -1
        self.return_log_probs = rollout.calculate_log_probs

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int = 0) -> int:
        """Copy full tensors (HF names) into the inference copy; returns how many were loaded."""
        targets = self.model.state_dict()
        loaded: set[str] = set()
        for name, tensor in named_tensors:
            if name not in targets:
                raise KeyError(f"rollout weight sync: {name!r} is not a parameter of the inference model")
            targets[name].copy_(tensor.to(device=self.device, dtype=targets[name].dtype))
            loaded.add(name)
        # Tied weights (lm_head = embeddings) may come under one name only.
        tied = {k for k in targets if k.endswith("lm_head.weight")} if self.model.config.tie_word_embeddings else set()
        missing = set(targets) - loaded - tied
        missing = {k for k in missing if not k.endswith("rotary_emb.inv_freq")}
        if missing:
            raise KeyError(f"rollout weight sync: no weights received for {sorted(missing)[:5]} ...")
        self.weights_version = version
        return len(loaded)

    def encode_prompts(self, prompts: list[list[int]], pad_to: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-pad token lists into ``input_ids`` and ``attention_mask`` of width ``pad_to``."""
        return layout.left_pad(prompts, self.pad_id, pad_to)

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int = 1,
        *,
        seed: int = 0,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        do_sample: bool | None = None,
        response_length: int | None = None,
        prompt_pad_to: int | None = None,
        micro_batch_size: int | None = None,
    ) -> Batch:
        """Sample ``n`` responses per prompt; sample ``j`` of prompt ``i`` is row ``i * n + j``."""
        sampling = rollout_sampling.resolve(self.cfg, temperature=temperature, top_p=top_p, top_k=top_k,
                                            do_sample=do_sample, response_length=response_length)
        response_length = sampling.response_length
        ro = self.cfg.actor_rollout_ref.rollout
        micro = micro_batch_size or ro.micro_batch_size_per_gpu or len(prompt_ids)
        if not prompt_ids:
            raise ValueError("rollout.generate got no prompts")

        prompts, prompt_mask = self.encode_prompts(prompt_ids, prompt_pad_to)
        prompts = prompts.repeat_interleave(n, dim=0)
        prompt_mask = prompt_mask.repeat_interleave(n, dim=0)
        gen_kwargs: dict[str, Any] = {
            "max_new_tokens": response_length,
            "do_sample": not sampling.greedy,
            "eos_token_id": self.eos_id,
            "pad_token_id": self.pad_id,
            "use_cache": True,
        }
        if sampling.greedy:
            # Unset sampling knobs so generate does not warn about them.
            gen_kwargs.update(temperature=None, top_p=None, top_k=None)
        else:
            gen_kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p,
                              top_k=sampling.top_k if sampling.top_k > 0 else 0)

        if self.return_log_probs:
            gen_kwargs.update(output_scores=True, return_dict_in_generate=True)
        responses = torch.full((prompts.shape[0], response_length), self.pad_id, dtype=torch.long)
        log_probs = torch.zeros(responses.shape, dtype=torch.float32) if self.return_log_probs else None
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), _decode_attention(self.device):
            torch.manual_seed(seed)
            for start in range(0, prompts.shape[0], micro * n):
                ids = prompts[start:start + micro * n].to(self.device)
                mask = prompt_mask[start:start + micro * n].to(self.device)
                out = self.model.generate(input_ids=ids, attention_mask=mask, **gen_kwargs)
                seqs = out.sequences if self.return_log_probs else out
                new = seqs[:, ids.shape[1]:]
                responses[start:start + new.shape[0], : new.shape[1]] = new.cpu()
                if log_probs is not None:
                    log_probs[start:start + new.shape[0], : new.shape[1]] = sampled_log_probs(out.scores, new).cpu()

        batch = layout.assemble(prompts, prompt_mask, responses, self.pad_id, self.eos_id)
        if log_probs is not None:
            # masked_fill, not a product: a pad after EOS may be a top-k/top-p -inf, and -inf * 0 is nan.
            batch["rollout_log_probs"] = log_probs.masked_fill(batch["response_mask"] == 0, 0.0)
        return batch


def sampled_log_probs(scores: tuple[torch.Tensor, ...], tokens: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` log-prob of each sampled token under the distribution it was drawn from.

    ``generate(output_scores=True)`` gives, per decoded position, the scores after every
    processor and warper (temperature, top-k, top-p: masked tokens are ``-inf``), the logits the
    sampler's softmax saw; vLLM's ``logprobs_mode=processed_logprobs`` is the same quantity.
    Computed in fp32 whatever the model dtype, so the rollout adds no rounding of its own.
    """
    steps = torch.stack(scores, dim=1).float()  # [B, T, V]
    return torch.log_softmax(steps, dim=-1).gather(-1, tokens[:, : steps.shape[1], None]).squeeze(-1)
