"""repro.rl.mfu: the FLOPs arithmetic on a model small enough to count by hand, and the device peaks
(the estimate and the peaks are checked against verl's own functions in tests/verl_parity)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from repro.rl.mfu import achieved_flops, device_name, device_peak_flops, flops_by_part, mfu

# One layer, hidden 4, 2 heads of 2, 1 KV head, MLP 8, vocab 10.
TINY = SimpleNamespace(model_type="qwen3", hidden_size=4, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, intermediate_size=8, vocab_size=10)


def test_dense_decoder_flops_counted_by_hand():
    # weights: MLP 3*4*8 = 96, attention 4*(4+2+2+4) = 48, embedding + LM head 2*10*4 = 80 -> 224
    # tokens 3 + 5 = 8: 6 * 224 * 8 = 10752; attention scores 6 * (9 + 25) * 2 * 2 * 1 = 816
    assert achieved_flops(TINY, [3, 5], seconds=2.0) == (10752 + 816) / 2.0


def test_the_flops_count_by_part_counted_by_hand():
    # attention 6 * (48 * 8 + 34 * 2 * 2) = 3120; MLP 6 * 96 * 8 = 4608; LM head = embedding = 6 * 40 * 8 = 1920
    # (they sum to the 10752 + 816 of the whole count above: achieved_flops is their sum)
    parts = flops_by_part(TINY, tokens=8, sq_tokens=34)
    assert parts == {"attention": 3120, "mlp": 4608, "lm_head": 1920, "embedding": 1920}
    assert flops_by_part(SimpleNamespace(**{**vars(TINY), "model_type": "gpt2"}), 8, 34) == {}


def test_model_types_outside_the_dense_family_count_zero():
    assert achieved_flops(SimpleNamespace(**{**vars(TINY), "model_type": "gpt2"}), [3], 1.0) == 0.0


@pytest.mark.parametrize(("name", "peak"), [("CPU", 448e9), ("NVIDIA H200", 989e12), ("NVIDIA H20", 148e12),
                                            ("NVIDIA L40S", 362.05e12), ("NVIDIA GeForce RTX 4090", float("inf"))])
def test_device_peak_is_the_most_specific_name_in_the_table(name, peak):
    assert device_peak_flops(name) == peak


def test_mfu_on_a_cpu_rank_is_over_448_gflops_and_forward_only_is_a_third():
    assert device_name(torch.device("cpu")) == "CPU"
    full = mfu(TINY, [3, 5], 2.0, "CPU", world_size=2)
    assert full == pytest.approx((10752 + 816) / 2.0 / 448e9 / 2)
    assert mfu(TINY, [3, 5], 2.0, "CPU", world_size=2, forward_only=True) == pytest.approx(full / 3)
    assert mfu(TINY, [3, 5], 2.0, "Tesla V100") == 0.0
