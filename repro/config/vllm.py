"""repro's rollout config as vLLM's ``LLM`` and ``SamplingParams`` arguments (pure; imports no vllm).

The one place vLLM's arguments are built (as DeepSpeed's JSON is in ``ds_config``); the driver
checks them here before any worker starts (``config_rules``), the rollout builds its engine here.

Keys honoured, as verl's seed commands set them: ``gpu_memory_utilization``, ``max_model_len``
(default prompt + response length), ``max_num_seqs``, ``max_num_batched_tokens``,
``enable_chunked_prefill``, ``enforce_eager``, ``load_format`` (verl's ``dummy_*`` names mean
vLLM's ``dummy``: the weights arrive from the actor before the first generation anyway),
``free_cache_engine`` (vLLM sleep mode, so the training step gets the memory back);
``tensor_model_parallel_size`` must be 1 (``config_rules``): one engine per rank, fed by that
rank's actor.

Sampling: ``n`` samples per prompt in one request; each request carries its own seed,
``seed + i * n`` for prompt ``i``, and vLLM seeds its ``j``-th child with ``+ j``, so every row
of a call has a distinct seed derived from repro's ``sampling_seed`` (reproducible on resume).
EOS is passed as a stop token id because the engine runs without a tokenizer (prompts are ids).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from repro.config import RunConfig

if TYPE_CHECKING:
    from repro.config.sampling import Sampling

LOAD_FORMATS = ("auto", "safetensors", "pt", "dummy")
SEED_MODULUS = 2**62  # leaves room for + i * n below 2**63 (torch generators take int64 seeds)


def load_format(name: str) -> str:
    """vLLM's load format for repro's ``rollout.load_format`` (verl's ``dummy_hf`` etc. become ``dummy``)."""
    fmt = "dummy" if name.startswith("dummy") else name
    if fmt not in LOAD_FORMATS:
        raise ValueError(
            f"actor_rollout_ref.rollout.load_format={name!r} is not valid; choose one of "
            f"{list(LOAD_FORMATS)} (or verl's dummy_* names)"
        )
    return fmt


def max_model_len(cfg: RunConfig) -> int:
    ro = cfg.actor_rollout_ref.rollout
    if ro.max_model_len:
        return ro.max_model_len
    return (ro.prompt_length or cfg.data.max_prompt_length) + (ro.response_length or cfg.data.max_response_length)


def engine_kwargs(cfg: RunConfig, *, worker_extension_cls: str | None = None) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` for this run's rollout."""
    ro = cfg.actor_rollout_ref.rollout
    model = cfg.actor_rollout_ref.model
    if not 0.0 < ro.gpu_memory_utilization < 1.0:
        raise ValueError(
            f"actor_rollout_ref.rollout.gpu_memory_utilization={ro.gpu_memory_utilization}: must be in (0, 1)"
        )
    length = max_model_len(cfg)
    if not ro.enable_chunked_prefill and ro.max_num_batched_tokens < length:
        raise ValueError(
            f"actor_rollout_ref.rollout.max_num_batched_tokens={ro.max_num_batched_tokens} is below max_model_len="
            f"{length}: without chunked prefill a prompt must fit one batch; raise it or set "
            "actor_rollout_ref.rollout.enable_chunked_prefill=True"
        )
    dtype = cfg.actor_rollout_ref.actor.deepspeed.model_dtype
    kwargs: dict[str, Any] = {
        "model": model.path,
        "skip_tokenizer_init": True,
        "trust_remote_code": model.trust_remote_code,
        "dtype": "bfloat16" if dtype == "auto" else dtype,
        "tensor_parallel_size": 1,
        "distributed_executor_backend": "uni",
        "gpu_memory_utilization": ro.gpu_memory_utilization,
        "max_model_len": length,
        "max_num_seqs": ro.max_num_seqs,
        "max_num_batched_tokens": ro.max_num_batched_tokens,
        "enable_chunked_prefill": ro.enable_chunked_prefill,
        "enforce_eager": ro.enforce_eager,
        "load_format": load_format(ro.load_format),
        "enable_sleep_mode": ro.free_cache_engine,
        "seed": cfg.trainer.seed,
        # Log-probs after temperature (and top-k/p): what the trainer recomputes as old_log_probs,
        # so rollout_corr/* measures the engines' disagreement, not the sampling settings.
        "logprobs_mode": "processed_logprobs",
    }
    if model.override_config:
        kwargs["hf_overrides"] = dict(model.override_config)
    if worker_extension_cls:
        kwargs["worker_extension_cls"] = worker_extension_cls
    return kwargs


def request_seeds(seed: int, num_prompts: int, n: int) -> list[int]:
    """One seed per prompt request, spaced by ``n`` so vLLM's per-child ``+ j`` never collides."""
    base = seed % SEED_MODULUS
    return [base + i * n for i in range(num_prompts)]


def sampling_kwargs(sampling: Sampling, n: int, eos_id: int, seed: int | None) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one request."""
    kwargs: dict[str, Any] = {
        "n": n,
        "max_tokens": sampling.response_length,
        "stop_token_ids": [eos_id],
        "detokenize": False,
        # The sampled token's log-prob only (0 alternatives): the trainer compares its own with it.
        "logprobs": 0,
    }
    if sampling.greedy:
        kwargs.update(temperature=0.0, top_p=1.0, top_k=0)
    else:
        kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p,
                      top_k=sampling.top_k if sampling.top_k > 0 else 0, seed=seed)
    return kwargs
