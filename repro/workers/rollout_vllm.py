"""vLLM rollout: an in-process ``vllm.LLM`` colocated with the rank's actor on its GPU.

Same interface as :class:`repro.workers.rollout_hf.HFRollout` (``load_weights``, ``generate``,
``device``, ``weights_version``) and the same batch layout (``rollout_layout``).

Why in process: each rank already holds the actor's full weights in its own CUDA memory
(``iter_full_weights``), so the simplest sync is to hand those tensors to the model's own
``load_weights`` in the same process. vLLM V1 runs its engine core in a subprocess by default;
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (set here before the engine is built) keeps engine core
and worker in this process, so ``LLM.collective_rpc`` calls :class:`WeightSync` (mixed into
vLLM's GPU worker as its ``worker_extension_cls``) directly with the tensors: no CUDA-IPC
handles (verl's way across processes), no copies beyond vLLM's own ``param.copy_``. vLLM's
Qwen3 ``load_weights`` takes Hugging Face names and stacks q/k/v and gate/up itself, so no name
mapping is needed. Weights stream in buckets (``weight_buckets``) and the prefix cache is reset
after each sync, since cached KV blocks were computed with the old weights.

Memory: with ``rollout.free_cache_engine`` (default) the engine is built with sleep mode and
put to sleep (level 1: weights to CPU, KV cache dropped) after every generation and right after
it is built, so the actor's forward/backward gets the memory back; it wakes before a weight
sync or a generation. ``rollout.mode=async`` is accepted and runs this same synchronous engine
(repro's trainer generates a whole batch per call; there is no server path).

Sampling: one request per prompt with ``n`` samples and its own seed (``vllm_settings``), so a
resumed run samples what the uninterrupted one did. The engine's global seeding at start-up is
kept away from the rank's RNG streams. ``micro_batch_size`` is ignored: vLLM schedules the whole
call within ``max_num_seqs`` / ``max_num_batched_tokens``. Log-probs are recomputed by the actor.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterable
from contextlib import contextmanager
from typing import Any

import torch

from repro.batching.batch import Batch
from repro.config import RunConfig
from repro.config import sampling as rollout_sampling
from repro.config import vllm as vllm_settings
from repro.devices import default_device, nvml_used_gb
from repro.workers import rollout_layout as layout
from repro.workers.weight_buckets import buckets

log = logging.getLogger(__name__)

BUCKET_BYTES = 512 * 2**20
SLEEP_LEVEL = 1


class WeightSync:
    """Methods mixed into vLLM's GPU worker (``worker_extension_cls``), called via ``collective_rpc``."""

    def repro_load_weights(self, named: list[tuple[str, torch.Tensor]]) -> int:
        self.model_runner.model.load_weights(weights=named)  # type: ignore[attr-defined]
        return len(named)


@contextmanager
def _rng_kept(device: torch.device):
    """vLLM seeds torch, numpy and random globally when it starts; the rank's streams stay as they were."""
    import numpy as np

    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[device]):
        yield
    random.setstate(py_state)
    np.random.set_state(np_state)


class VLLMRollout:
    """Sampling with a colocated vLLM engine, weights pushed from the actor every step."""

    def __init__(self, cfg: RunConfig, device: torch.device | None = None) -> None:
        from repro.data.tokenizer import load_tokenizer

        self.cfg = cfg
        self.device = device or default_device()
        if self.device.type != "cuda":
            raise ValueError("actor_rollout_ref.rollout.name=vllm needs CUDA (trainer.device=cuda); "
                             "use actor_rollout_ref.rollout.name=hf on CPU")
        model_cfg = cfg.actor_rollout_ref.model
        tok = load_tokenizer(model_cfg.tokenizer_path or model_cfg.path, model_cfg.trust_remote_code)
        self.eos_id = tok.eos_token_id
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else self.eos_id
        if self.eos_id is None:
            raise ValueError(f"tokenizer of {model_cfg.path} has no eos_token; the rollout needs one to stop")
        kwargs = vllm_settings.engine_kwargs(cfg, worker_extension_cls=f"{__name__}.{WeightSync.__qualname__}")
        self.engine_kwargs = kwargs
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from vllm import LLM

        with _rng_kept(self.device):
            self.llm = LLM(**kwargs)
        self.sleeps = bool(kwargs["enable_sleep_mode"])
        self._asleep = False
        self.weights_version = -1
        self.awake_nvml_gb: float | None = None
        """NVML memory in use at the end of the last generation, before the engine slept."""
        self._sleep()

    def _sleep(self) -> None:
        if self.sleeps and not self._asleep:
            self.llm.sleep(level=SLEEP_LEVEL)
            self._asleep = True

    def _wake(self) -> None:
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int = 0) -> int:
        """Push full tensors (HF names) into the engine in buckets; returns how many were loaded."""
        self._wake()
        count = 0
        for bucket in buckets(named_tensors, BUCKET_BYTES):
            count += sum(self.llm.collective_rpc("repro_load_weights", args=(bucket,)))
        self.llm.reset_prefix_cache()
        self.weights_version = version
        return count

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
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if not prompt_ids:
            raise ValueError("rollout.generate got no prompts")
        sampling = rollout_sampling.resolve(self.cfg, temperature=temperature, top_p=top_p, top_k=top_k,
                                            do_sample=do_sample, response_length=response_length)
        params = [SamplingParams(**vllm_settings.sampling_kwargs(sampling, n, self.eos_id, s))
                  for s in vllm_settings.request_seeds(seed, len(prompt_ids), n)]
        prompts: list[Any] = [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_ids]
        self._wake()
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        self.awake_nvml_gb = nvml_used_gb()
        self._sleep()
        completions = [c for o in outs for c in sorted(o.outputs, key=lambda c: c.index)]
        samples = [list(c.token_ids) for c in completions]
        # Each position's dict holds the sampled token (logprobs=0 asks for no alternatives).
        log_probs = [[pos[t].logprob for pos, t in zip(c.logprobs, c.token_ids, strict=True)] for c in completions]
        return layout.batch_from_samples(prompt_ids, samples, n, pad_id=self.pad_id, eos_id=self.eos_id,
                                         response_length=sampling.response_length, prompt_pad_to=prompt_pad_to,
                                         sample_log_probs=log_probs)
