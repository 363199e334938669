"""repro.rl.mfu: the FLOPs arithmetic on a model small enough to count by hand, and the device peaks
(the estimate and the peaks are checked against verl's own functions in tests/verl_parity)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from repro.rl.mfu import achieved_flops, device_name, device_peak_flops, mfu

# One layer, hidden 4, 2 heads of 2, 1 KV head, MLP 8, vocab 10.
TINY = SimpleNamespace(model_type="qwen3", hidden_size=4, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, intermediate_size=8, vocab_size=10)


def test_dense_decoder_flops_counted_by_hand():
    # weights: MLP 3*4*8 = 96, attention 4*(4+2+2+4) = 48, embedding + LM head 2*10*4 = 80 -> 224
    # tokens 3 + 5 = 8: 6 * 224 * 8 = 10752; attention scores 6 * (9 + 25) * 2 * 2 * 1 = 816
    assert achieved_flops(TINY, [3, 5], seconds=2.0) == (10752 + 816) / 2.0


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
