"""The varlen attention path's sample boundaries: one sample per run of positions growing by
one, every row starting one, so that FlashAttention over them is the block-causal attention
of the packed rows (the CUDA comparison is in tests/gpu_e2e/test_varlen_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.workers import varlen
from tests.error_model import decoder_chain, float_tol


@settings(max_examples=50, deadline=None)
@given(rows=st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=5), min_size=1, max_size=4),
       tail=st.integers(0, 3))
def test_cu_seqlens_delimit_the_packed_samples_and_row_tails(rows, tail):
    width = max(sum(r) for r in rows) + tail
    pos = torch.zeros(len(rows), width, dtype=torch.long)
    expected = []
    for r, lengths in enumerate(rows):
        col = 0
        for n in lengths:
            pos[r, col:col + n] = torch.arange(n)
            expected.append(n)
            col += n
        expected += [1] * (width - col)  # tail pads at position 0: one-token samples
    cu, longest = varlen.cu_seqlens(pos)
    assert cu.dtype == torch.int32
    assert (cu[1:] - cu[:-1]).tolist() == expected
    assert cu[0] == 0 and cu[-1] == pos.numel() and longest == max(expected)


def test_varlen_is_not_used_on_cpu_or_in_fp32():
    assert not varlen.supported(torch.bfloat16)  # the unit tests run with DS_ACCELERATOR=cpu
    assert not varlen.supported(torch.float32)


def _reference_varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size=(-1, -1), enable_gqa=False,
                           scale=None):
    """torch's varlen_attn contract (``[T, H, D]``, causal per ``cu_seqlens`` segment) in plain SDPA,
    standing in for the CUDA-only kernel so that the plumbing around it runs on CPU."""
    assert window_size == (-1, 0) and enable_gqa and max_q == max_k == int((cu_q[1:] - cu_q[:-1]).max())
    out = torch.empty_like(q)
    rep = q.shape[1] // k.shape[1]
    for s, e in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), strict=True):
        out[s:e] = torch.nn.functional.scaled_dot_product_attention(
            q[s:e].transpose(0, 1), k[s:e].transpose(0, 1).repeat_interleave(rep, 0),
            v[s:e].transpose(0, 1).repeat_interleave(rep, 0), is_causal=True, scale=scale).transpose(0, 1)
    return out


def test_packed_one_row_forward_through_the_varlen_function_equals_the_padded_batch(monkeypatch):
    import copy

    from transformers import Qwen3Config, Qwen3ForCausalLM

    from repro.workers.logprob import token_log_probs
    from repro.workers.packing import pack

    monkeypatch.setattr(varlen, "_varlen_attn", lambda: _reference_varlen_attn)
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, initializer_range=0.2,
                      attn_implementation="sdpa")
    padded_model = Qwen3ForCausalLM(cfg).double()
    packed_model = copy.deepcopy(padded_model)
    varlen.enable(packed_model)
    gen = torch.Generator().manual_seed(3)
    b, p, r = 5, 9, 11
    p_lens, r_lens = torch.randint(1, p + 1, (b,), generator=gen), torch.randint(0, r + 1, (b,), generator=gen)
    mask = torch.cat([torch.arange(p)[None] >= (p - p_lens)[:, None], torch.arange(r)[None] < r_lens[:, None]], 1)
    ids = torch.randint(3, 128, (b, p + r), generator=gen) * mask
    pos = (mask.long().cumsum(1) - 1).clamp(min=0)
    response_mask = mask[:, p:].long()
    logits = padded_model(input_ids=ids, attention_mask=mask.long(), position_ids=pos,
                          logits_to_keep=r + 1).logits[:, :-1]
    padded = token_log_probs(logits, ids[:, p:])[0] * response_mask
    packed = pack(ids, mask.long(), pos, one_row=True)
    slots = packed.response_slots(response_mask)
    logits = packed_model(input_ids=packed.input_ids, position_ids=packed.position_ids,
                          logits_to_keep=slots.columns).logits
    got = slots.scatter(token_log_probs(logits, packed.next_token[:, slots.columns])[0])
    # fp64, the same math in two summation orders (per-sample attention of the packed row against
    # the padded rows' masked attention): tests/error_model.py's bound along the model's chain
    tol = float_tol(decoder_chain(cfg, p + r), padded.detach().abs().max(), torch.float64)
    assert (got - padded).abs().max().item() <= tol


def test_the_varlen_key_makes_transformers_skip_mask_creation_and_its_packed_sequence_scan(monkeypatch):
    # A registered mask function that returns None still let transformers scan the packed
    # positions first (find_packed_sequence_indices: a device sync on every forward).
    from transformers import masking_utils

    from repro.data.tiny_model import PolicyShape, build_model, tiny_config

    model = build_model(tiny_config(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                    shape=PolicyShape(hidden_size=64, num_hidden_layers=1, intermediate_size=128)))
    varlen.enable(model)

    def scanned(*args, **kwargs):
        raise AssertionError("find_packed_sequence_indices ran")

    monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", scanned)
    pos = torch.tensor([[0, 1, 2, 0, 1, 0]])
    embeds = torch.zeros(1, 6, 64)
    mask = masking_utils.create_causal_mask(config=model.config, inputs_embeds=embeds, attention_mask=None,
                                            past_key_values=None, position_ids=pos)
    assert mask is None
    model.set_attn_implementation("sdpa")  # the same call under sdpa does scan: the patch is live
    with pytest.raises(AssertionError, match="find_packed_sequence_indices ran"):
        masking_utils.create_causal_mask(config=model.config, inputs_embeds=embeds, attention_mask=None,
                                         past_key_values=None, position_ids=pos)


def test_every_flash_attention_choice_names_a_kernel_set_of_torchs_registry():
    from repro.config.fields import FLASH_ATTENTION

    assert tuple(varlen.FLASH_IMPLS) == FLASH_ATTENTION
    assert varlen.FLASH_IMPLS["torch"] is None  # torch's bundled FlashAttention-2: nothing to activate


def test_fa4_is_not_activated_where_the_varlen_path_does_not_run():
    # CPU and fp32 attend without flash kernels: activating FA4 there would import its CUDA-only package for nothing
    assert varlen.activate("fa4", torch.bfloat16) == "torch"
    assert varlen.activate("fa4", torch.float32) == "torch"
    assert varlen.current_impl() == "torch"


def test_the_boundaries_are_computed_once_per_forward_before_the_layers_and_reach_every_layer(monkeypatch):
    """One ``cu_seqlens`` per forward, outside the decoder layers (a compiled layer must not sync or branch on a
    cache: ``varlen.with_boundaries``), the same tensor in every layer's attention call and in gradient
    checkpointing's recomputation; a caller that passes transformers' flash kwargs itself keeps them."""
    from repro.data.tiny_model import PolicyShape, build_model, tiny_config

    calls, computed = [], []
    cu_seqlens = varlen.cu_seqlens

    def counted(pos):
        computed.append(pos)
        return cu_seqlens(pos)

    def recording(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size=(-1, -1), enable_gqa=False, scale=None):
        calls.append((cu_q, cu_k, max_q, max_k))
        return _reference_varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, window_size=window_size, enable_gqa=True,
                                      scale=scale)

    def in_a_layer(pos):
        raise AssertionError("a layer computed the boundaries (a host sync inside a compiled layer)")

    monkeypatch.setattr(varlen, "_varlen_attn", lambda: recording)
    monkeypatch.setattr(varlen, "cu_seqlens", counted)
    monkeypatch.setattr(varlen, "_boundaries", in_a_layer)
    model = build_model(tiny_config(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                    shape=PolicyShape(hidden_size=64, num_hidden_layers=2, intermediate_size=128)))
    varlen.enable(model)
    varlen.enable(model)  # a second role setup on the same model: still one hook
    assert len(model._forward_pre_hooks) == 1
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 0, 1, 2, 0]])
    ids = torch.randint(3, 64, pos.shape, generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, position_ids=pos, use_cache=False).logits.sum().backward()
    assert len(computed) == 1  # once, though 2 layers attended twice each (forward, recomputation)
    assert len(calls) == 4 and all(c[0] is calls[0][0] and c[1] is calls[0][0] for c in calls)
    assert calls[0][0].tolist() == [0, 4, 6, 9, 10] and {c[2] for c in calls} == {c[3] for c in calls} == {4}

    mine = torch.tensor([0, 4, 6, 9, 10], dtype=torch.int32)
    model(input_ids=ids, position_ids=pos, use_cache=False, cu_seq_lens_q=mine, cu_seq_lens_k=mine,
          max_length_q=4, max_length_k=4)
    assert len(computed) == 1 and calls[-1][0] is mine


def test_a_lora_wrapped_model_still_gets_its_boundaries_from_the_hook(monkeypatch):
    """The actor enables the varlen path before peft wraps the model (``repro.workers.lora.wrap``): peft's wrappers
    call the model (``__call__``), so the pre-hook still computes the boundaries once per forward."""
    from peft import LoraConfig, get_peft_model

    from repro.data.tiny_model import PolicyShape, build_model, tiny_config

    computed = []
    cu_seqlens = varlen.cu_seqlens
    monkeypatch.setattr(varlen, "cu_seqlens", lambda pos: computed.append(pos) or cu_seqlens(pos))
    monkeypatch.setattr(varlen, "_varlen_attn", lambda: _reference_varlen_attn)
    monkeypatch.setattr(varlen, "_boundaries", lambda pos: pytest.fail("a layer computed the boundaries"))
    model = build_model(tiny_config(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                    shape=PolicyShape(hidden_size=64, num_hidden_layers=2, intermediate_size=128)))
    varlen.enable(model)
    wrapped = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    wrapped(input_ids=torch.randint(3, 64, pos.shape), position_ids=pos, use_cache=False)
    assert len(computed) == 1 and computed[0] is pos
