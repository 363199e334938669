"""The fused RMSNorm forward (:mod:`repro.workers.rms_norm`) against an fp64 reference, forward and backward.

The fused path computes in fp32 and rounds its output (and each gradient) to the input dtype once:
each element is within one rounding (``u = eps / 2`` relative) of the exact value, plus the fp32
accumulation of the mean over ``hidden`` terms (and, for the weight's gradient, the sum over tokens).
Some rows are scaled to ``1e-3`` so that ``mean(x**2)`` is ~``eps`` of the norm: a wrong epsilon,
normalised shape or weight moves those by far more than the bound. On CUDA the same comparison runs
in ``tests/gpu_e2e/test_rms_norm_gpu.py``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from repro.data.tiny_model import PolicyShape, build_model, tiny_config
from repro.workers import rms_norm
from tests.error_model import assert_one_rounding, decoder_chain, float_tol

HIDDEN, EPS = 96, 1e-6


def _inputs(dtype: torch.dtype) -> tuple[Qwen3RMSNorm, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    norm = Qwen3RMSNorm(HIDDEN, eps=EPS)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(HIDDEN, generator=gen) + 0.5)
    x = torch.randn(3, 37, HIDDEN, generator=gen) * 3
    x[1, ::4] *= 1e-3  # mean(x**2) ~ 1e-5: the epsilon is a tenth of it
    g = torch.randn(3, 37, HIDDEN, generator=gen)
    return norm.to(dtype), x.to(dtype), g.to(dtype)


def _reference(norm: Qwen3RMSNorm, x: torch.Tensor, g: torch.Tensor):
    x64 = x.double().requires_grad_()
    w64 = norm.weight.detach().double().requires_grad_()
    y = w64 * x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS)
    y.backward(g.double())
    return y.detach(), x64.grad, w64.grad


def _run(norm: torch.nn.Module, x: torch.Tensor, g: torch.Tensor):
    x = x.clone().requires_grad_()
    y = norm(x)
    y.backward(g)
    return y.detach().double(), x.grad.double(), norm.weight.grad.double()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_fused_norm_is_one_rounding_from_the_exact_norm_and_its_gradients(dtype):
    norm, x, g = _inputs(dtype)
    fused = copy.deepcopy(norm)
    assert rms_norm.enable(fused) == 1
    y, dx, dw = _run(fused, x, g)
    y_ref, dx_ref, dw_ref = _reference(norm, x, g)
    inv_rms = torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + EPS)
    w = norm.weight.detach().double().abs()
    assert_one_rounding(y, y_ref, dtype, HIDDEN, (w * x.double().abs() * inv_rms).amax(-1, keepdim=True))
    # dx = inv_rms * (w g - x_hat * mean(x_hat w g)): sums over the row, magnitude |w g| inv_rms
    assert_one_rounding(dx, dx_ref, dtype, 2 * HIDDEN, (w * g.double().abs()).amax(-1, keepdim=True) * inv_rms * 2)
    # dw = sum over tokens of g * x_hat
    tokens = x.shape[0] * x.shape[1]
    assert_one_rounding(dw, dw_ref, dtype, tokens + HIDDEN, (g.double().abs() * (x.double() * inv_rms).abs()).sum((0, 1)))


def test_a_wrong_epsilon_is_outside_the_bound():
    # the bound's power: the same comparison with the norm's epsilon off by 10x fails on the small rows
    norm, x, g = _inputs(torch.bfloat16)
    fused = copy.deepcopy(norm)
    rms_norm.enable(fused)
    fused.variance_epsilon = EPS * 10
    y, _, _ = _run(fused, x, g)
    y_ref, _, _ = _reference(norm, x, g)
    inv_rms = torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + EPS)
    with pytest.raises(AssertionError, match="over the bound"):
        assert_one_rounding(y, y_ref, torch.bfloat16, HIDDEN, (norm.weight.detach().double().abs() * x.double().abs()
                                                   * inv_rms).amax(-1, keepdim=True))


def test_enable_changes_every_qwen3_norm_of_one_model_and_no_other_instance():
    cfg = tiny_config(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                      shape=PolicyShape(hidden_size=64, num_hidden_layers=3, intermediate_size=128))
    model, other = build_model(cfg, seed=0), build_model(cfg, seed=0)
    # four a layer (input, post-attention, q, k) and the final norm
    assert rms_norm.enable(model) == 4 * 3 + 1 == rms_norm.fused_count(model)
    assert rms_norm.enable(model) == 0  # already fused: nothing changes twice
    assert rms_norm.fused_count(other) == 0
    assert "forward" not in vars(other.model.norm)
    ids = torch.randint(3, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fused_logits, eager_logits = model(input_ids=ids).logits, other(input_ids=ids).logits
    # fp32, the same math in another order: the decoder chain's fp32 bound (tests/error_model.py)
    tol = float_tol(decoder_chain(cfg, ids.shape[1]), eager_logits.abs().max())
    assert (fused_logits - eager_logits).abs().max() <= tol


def test_the_norms_are_not_fused_on_cpu_or_in_fp32():
    assert not rms_norm.supported(torch.bfloat16)  # the unit tests run with DS_ACCELERATOR=cpu
    assert not rms_norm.supported(torch.float32)


def test_mode_forces_either_form_and_refuses_an_unknown_one(monkeypatch):
    monkeypatch.setattr(rms_norm, "MODE", "fused")  # the benchmark's CPU count of the fused form's host work
    assert rms_norm.supported(torch.float32)
    monkeypatch.setattr(rms_norm, "MODE", "eager")
    assert not rms_norm.supported(torch.bfloat16)
    monkeypatch.setattr(rms_norm, "MODE", "on")
    with pytest.raises(ValueError, match=r"MODE='on' is not valid; choose one of \['auto', 'fused', 'eager'\]"):
        rms_norm.supported(torch.bfloat16)


def test_every_norm_class_fused_has_the_llama_forms_forward_in_this_transformers():
    # the fused forward replaces these classes' forward: it must be the one form it computes
    import importlib
    import inspect

    reference = inspect.getsource(Qwen3RMSNorm.forward)
    for name in rms_norm._LLAMA_FORM:
        model = name.removesuffix("RMSNorm").lower().replace("qwen3moe", "qwen3_moe")
        cls = getattr(importlib.import_module(f"transformers.models.{model}.modeling_{model}"), name)
        assert inspect.getsource(cls.forward) == reference, name
