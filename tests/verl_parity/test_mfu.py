"""repro.rl.mfu against verl 0.9.1's ``utils.flops_counter``: the FLOPs estimate, the device peak and
the MFU verl's workers compute from them (``estimated / promised / world``, ``/ 3`` forward-only).

verl's own functions are called: its per-model-type estimators (``ESTIMATE_FUNC``, falling back to
``_estimate_unknown_flops`` as ``FlopsCounter.estimate_flops`` does) and ``get_device_flops`` with
an explicit device name. ``FlopsCounter.estimate_flops`` itself is not called: it asks
``get_device_flops()`` for the current device, which on a machine without CUDA raises in verl
0.9.1 (its platform falls back to ``torch.cuda``); the CPU entry of its table (448 GFLOP/s) is
what verl means for a CPU, and what repro uses there.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from hypothesis import given
from hypothesis import strategies as st
from verl.utils import flops_counter

from repro.rl.mfu import DENSE_DECODERS, DEVICE_PEAK_FLOPS, achieved_flops, device_peak_flops, mfu
from tests.verl_parity.inputs import close

# the flops formula's operations plus one a sequence (at most 8) and the divisions by seconds, peak, world
MFU_TERMS = 64

KEYS = sorted(DEVICE_PEAK_FLOPS)
# Names as devices report them: a table key inside vendor text, two keys at once, or nothing known.
NAMES = st.one_of(
    st.builds(lambda pre, key, post: f"{pre}{key}{post}", st.sampled_from(["", "NVIDIA ", "AMD Instinct "]),
              st.sampled_from(KEYS), st.sampled_from(["", " 80GB HBM3", "-SXM", " NVL"])),
    st.builds(lambda a, b: f"{a} {b}", st.sampled_from(KEYS), st.sampled_from(KEYS)),
    st.sampled_from(["NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-32GB", "cpu", ""]),
)


@st.composite
def model_configs(draw):
    heads = draw(st.sampled_from([1, 2, 4, 16]))
    config = SimpleNamespace(
        model_type=draw(st.sampled_from([*DENSE_DECODERS, "gpt2", "bert"])),
        hidden_size=heads * draw(st.sampled_from([8, 64, 128])),
        num_hidden_layers=draw(st.integers(1, 36)),
        num_attention_heads=heads,
        num_key_value_heads=draw(st.sampled_from([h for h in (1, 2, 4, 16) if heads % h == 0])),
        intermediate_size=draw(st.integers(1, 20000)),
        vocab_size=draw(st.integers(2, 160000)),
    )
    if draw(st.booleans()):  # Qwen3 sets head_dim apart from hidden / heads
        config.head_dim = draw(st.sampled_from([16, 64, 128]))
    return config


def _verl_estimate(config, seqlens, seconds):
    fn = flops_counter.ESTIMATE_FUNC.get(config.model_type, flops_counter._estimate_unknown_flops)
    return fn(config, sum(seqlens), seqlens, seconds)


@given(name=NAMES)
def test_device_peak_matches_verl(name):
    close(device_peak_flops(name) / 1e12, flops_counter.get_device_flops(unit="T", device_name=name))


@given(config=model_configs(), seqlens=st.lists(st.integers(1, 4096), min_size=1, max_size=8),
       seconds=st.floats(1e-3, 100.0), name=NAMES, world=st.integers(1, 16), forward_only=st.booleans())
def test_flops_estimate_and_mfu_match_verl(config, seqlens, seconds, name, world, forward_only):
    theirs = _verl_estimate(config, seqlens, seconds)
    # Python floats (fp64) in formulas grouped otherwise than verl's: a few dozen products and sums
    close(achieved_flops(config, seqlens, seconds) / 1e12, theirs, MFU_TERMS, dtype=torch.float64)
    expected = theirs / flops_counter.get_device_flops(unit="T", device_name=name) / world
    close(mfu(config, seqlens, seconds, name, world, forward_only), expected / 3 if forward_only else expected,
          MFU_TERMS, dtype=torch.float64)
