"""repro's rollout keys as vLLM engine and sampling arguments (no vllm needed)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.config import RunConfig
from repro.config import sampling as rollout_sampling
from repro.config import vllm as vllm_settings


def _cfg(**rollout) -> RunConfig:
    cfg = RunConfig()
    cfg.actor_rollout_ref.model.path = "/models/m"
    cfg.data.max_prompt_length, cfg.data.max_response_length = 100, 28
    for key, value in rollout.items():
        setattr(cfg.actor_rollout_ref.rollout, key, value)
    return cfg


def test_seed_keys_reach_the_engine_arguments():
    cfg = _cfg(gpu_memory_utilization=0.35, max_num_seqs=256, max_num_batched_tokens=4096,
               enable_chunked_prefill=False, enforce_eager=False, load_format="dummy_dtensor",
               free_cache_engine=True, max_model_len=2048)
    cfg.trainer.seed = 9
    kw = vllm_settings.engine_kwargs(cfg, worker_extension_cls="a.B")
    assert kw == {
        "model": "/models/m", "skip_tokenizer_init": True, "trust_remote_code": False, "dtype": "bfloat16",
        "tensor_parallel_size": 1, "distributed_executor_backend": "uni", "gpu_memory_utilization": 0.35,
        "max_model_len": 2048, "max_num_seqs": 256, "max_num_batched_tokens": 4096,
        "enable_chunked_prefill": False, "enforce_eager": False, "load_format": "dummy",
        "enable_sleep_mode": True, "seed": 9, "worker_extension_cls": "a.B", "logprobs_mode": "processed_logprobs",
    }


def test_max_model_len_defaults_to_prompt_plus_response():
    assert vllm_settings.engine_kwargs(_cfg())["max_model_len"] == 128
    assert vllm_settings.engine_kwargs(_cfg(prompt_length=10, response_length=5))["max_model_len"] == 15


@pytest.mark.parametrize(("rollout", "match"), [
    ({"gpu_memory_utilization": 1.0}, "gpu_memory_utilization=1.0"),
    ({"load_format": "gguf"}, "load_format='gguf'"),
    ({"enable_chunked_prefill": False, "max_num_batched_tokens": 64}, "max_num_batched_tokens=64"),
])
def test_bad_rollout_keys_are_named(rollout, match):
    with pytest.raises(ValueError, match=match):
        vllm_settings.engine_kwargs(_cfg(**rollout))


def test_sampling_arguments_follow_the_config_and_the_call():
    cfg = _cfg(temperature=0.7, top_p=0.9, top_k=20)
    s = rollout_sampling.resolve(cfg)
    assert vllm_settings.sampling_kwargs(s, 4, eos_id=3, seed=11) == {
        "n": 4, "max_tokens": 28, "stop_token_ids": [3], "detokenize": False, "logprobs": 0,
        "temperature": 0.7, "top_p": 0.9, "top_k": 20, "seed": 11,
    }
    s = rollout_sampling.resolve(cfg, top_k=-1, response_length=5)
    kw = vllm_settings.sampling_kwargs(s, 1, eos_id=3, seed=11)
    assert kw["top_k"] == 0 and kw["max_tokens"] == 5


@pytest.mark.parametrize("call", [{"do_sample": False}, {"temperature": 0.0}])
def test_greedy_calls_are_greedy_in_vllm(call):
    s = rollout_sampling.resolve(_cfg(temperature=1.0), **call)
    kw = vllm_settings.sampling_kwargs(s, 2, eos_id=3, seed=11)
    assert (kw["temperature"], kw["top_p"], kw["top_k"]) == (0.0, 1.0, 0) and "seed" not in kw


@settings(max_examples=40)
@given(seed=st.integers(min_value=0, max_value=2**63 - 1), prompts=st.integers(min_value=1, max_value=64),
       n=st.integers(min_value=1, max_value=16))
def test_every_row_of_a_call_gets_a_distinct_int64_seed(seed, prompts, n):
    # vLLM seeds child j of a request with request seed + j.
    rows = [s + j for s in vllm_settings.request_seeds(seed, prompts, n) for j in range(n)]
    assert len(set(rows)) == prompts * n
    assert all(0 <= r < 2**63 for r in rows)
    assert vllm_settings.request_seeds(seed, prompts, n) == vllm_settings.request_seeds(seed, prompts, n)


@pytest.mark.parametrize(("key", "match"), [
    ("actor_rollout_ref.rollout.load_format=gguf", "load_format='gguf'"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size=2", "tensor_model_parallel_size=2"),
])
def test_the_driver_refuses_bad_vllm_keys_before_any_worker_starts(key, match):
    from repro.config.loader import load_config

    with pytest.raises(ValueError, match=match):
        load_config(["actor_rollout_ref.rollout.name=vllm", key, "trainer.dry_run=true"])
