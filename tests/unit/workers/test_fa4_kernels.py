"""The adapter between torch's FA4 glue and flash-attn-4's kernels keeps their leading results, whichever form a
release returns (4.0.0b36: five from the forward, where torch 2.11's glue unpacks two), and passes every argument
through. The kernels themselves run on Hopper/Blackwell only: tests/gpu_e2e/test_varlen_gpu.py compares them."""

from __future__ import annotations

import sys
import types

import pytest

from repro.workers import fa4_kernels


@pytest.fixture
def kernels(monkeypatch):
    """A stand-in for ``flash_attn.cute.interface`` recording its calls (the package is CUDA-only)."""
    calls, module = [], types.ModuleType(fa4_kernels.MODULE)
    for name in ("flash_attn", "flash_attn.cute"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, fa4_kernels.MODULE, module)
    sys.modules["flash_attn.cute"].interface = module
    return calls, module


@pytest.mark.parametrize("extra", [(), ("p", "row_max", "o_lo")], ids=["two results", "five results (4.0.0b36)"])
def test_the_forward_gives_torch_out_and_lse_and_passes_every_argument(kernels, extra):
    calls, module = kernels
    module._flash_attn_fwd = lambda *a, **k: (calls.append((a, k)), ("out", "lse", *extra))[1]
    assert fa4_kernels._flash_attn_fwd("q", "k", "v", causal=True, cu_seqlens_q="cu") == ("out", "lse")
    assert calls == [(("q", "k", "v"), {"causal": True, "cu_seqlens_q": "cu"})]


@pytest.mark.parametrize("extra", [(), ("dsink",)], ids=["three results", "with a sink's gradient"])
def test_the_backward_gives_torch_the_three_input_gradients(kernels, extra):
    calls, module = kernels
    module._flash_attn_bwd = lambda *a, **k: (calls.append((a, k)), ("dq", "dk", "dv", *extra))[1]
    assert fa4_kernels._flash_attn_bwd("q", "k", "v", "out", "dout", "lse", deterministic=False) == ("dq", "dk", "dv")
    assert calls == [(("q", "k", "v", "out", "dout", "lse"), {"deterministic": False})]
