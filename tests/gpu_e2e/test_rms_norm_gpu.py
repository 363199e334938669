"""On CUDA, the fused RMSNorm (:mod:`repro.workers.rms_norm`) is one bf16 rounding from the exact norm,
forward and backward, and a bf16 model loaded by the workers runs it in every norm.

The CPU suite checks the same bound on torch's CPU implementation (``tests/unit/workers/test_rms_norm.py``);
this checks the CUDA kernel the GPU runs use. Run with ``REPRO_GPU_TESTS=1`` (the repository conftest
otherwise pins DeepSpeed, and so the workers' device checks, to the CPU).
"""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import require_cuda_gpus
from repro.workers import rms_norm
from tests.error_model import assert_one_rounding

pytestmark = pytest.mark.gpu

HIDDEN, EPS = 1024, 1e-6


@pytest.fixture(autouse=True)
def _cuda():
    require_cuda_gpus(1)
    if not rms_norm.supported(torch.bfloat16):
        pytest.fail("the workers are pinned to the CPU (set REPRO_GPU_TESTS=1)")


def test_the_cuda_kernel_is_one_rounding_from_the_exact_norm_and_its_gradients():
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    gen = torch.Generator().manual_seed(0)
    norm = Qwen3RMSNorm(HIDDEN, eps=EPS)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(HIDDEN, generator=gen) + 0.5)
    x = torch.randn(4, 300, HIDDEN, generator=gen) * 3
    x[1, ::4] *= 1e-3  # mean(x**2) ~ 1e-5: a wrong epsilon shows
    g = torch.randn(4, 300, HIDDEN, generator=gen)
    norm, x, g = norm.to("cuda", torch.bfloat16), x.to("cuda", torch.bfloat16), g.to("cuda", torch.bfloat16)
    fused = copy.deepcopy(norm)
    assert rms_norm.enable(fused) == 1
    xr = x.clone().requires_grad_()
    y = fused(xr)
    y.backward(g)

    x64 = x.double().requires_grad_()
    w64 = norm.weight.detach().double().requires_grad_()
    y64 = w64 * x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS)
    y64.backward(g.double())
    inv_rms = torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + EPS)
    w = w64.detach().abs()
    assert_one_rounding(y.double(), y64.detach(), torch.bfloat16, HIDDEN,
                        (w * x.double().abs() * inv_rms).amax(-1, keepdim=True))
    assert_one_rounding(xr.grad.double(), x64.grad, torch.bfloat16, 2 * HIDDEN,
                        (w * g.double().abs()).amax(-1, keepdim=True) * inv_rms * 2)
    assert_one_rounding(fused.weight.grad.double(), w64.grad, torch.bfloat16, x.shape[0] * x.shape[1] + HIDDEN,
                        (g.double().abs() * (x.double() * inv_rms).abs()).sum((0, 1)))


def test_a_bf16_model_loaded_by_the_workers_fuses_every_norm(tmp_path):
    from repro.config import ModelConfig
    from repro.data.tiny_model import PolicyShape, build_model, tiny_config
    from repro.workers.engine import load_hf_model

    cfg = tiny_config(vocab_size=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                      shape=PolicyShape(hidden_size=64, num_hidden_layers=3, intermediate_size=128))
    build_model(cfg, seed=0).save_pretrained(tmp_path, safe_serialization=True)
    model_cfg = ModelConfig(path=str(tmp_path))
    assert rms_norm.fused_count(load_hf_model(model_cfg, torch.bfloat16)) == 4 * 3 + 1
    assert rms_norm.fused_count(load_hf_model(model_cfg, torch.float32)) == 0
