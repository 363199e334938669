"""On CUDA, decoder layers compiled by inductor (:mod:`repro.workers.layer_compile`) compute what the eager
layers compute, to bf16's precision: the kernel path of the rmpad bench's ``rmpad_compiled`` case.

Error model: eager bf16 rounds every op's output to bf16; inductor fuses ops and keeps the fused intermediates in
fp32, reducing in another order. Neither is the exact value, so both are held against an fp64 copy of the same model
on the same input: the compiled layers' distance from fp64 (logits, and every parameter's gradient, as relative L2
norms) is at most twice the eager layers' own distance (the same number of bf16 roundings or fewer, each at most one
unit; 2x covers another reduction order), and dynamo captured graphs (a compile that did nothing would pass the first
check trivially). The CPU suite proves the traced layers bitwise with backend ``aot_eager``
(``tests/distributed/workers/test_layer_compile.py``). Run with ``REPRO_GPU_TESTS=1``.
"""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import require_cuda_gpus

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _cuda():
    require_cuda_gpus(1)


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref).norm() / ref.norm())


def _logits_and_grads(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits
    logits.float().log_softmax(-1).mean().backward()
    return logits.detach(), {n: p.grad.detach() for n, p in model.named_parameters() if p.grad is not None}


# layer: the 3 layers each compiled; stack: the base model holding them, one region (model.compile_scope)
@pytest.mark.parametrize(("scope", "modules"), [("layer", 3), ("stack", 1)])
def test_inductor_compiled_layers_are_as_close_to_fp64_as_the_eager_layers(tmp_path, monkeypatch, scope, modules):
    from repro.config import ModelConfig
    from repro.data.tiny_model import PolicyShape, build_model, tiny_config
    from repro.workers.engine import load_hf_model
    from repro.workers.layer_compile import captured_graphs, compile_decoder_layers

    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    cfg = tiny_config(vocab_size=1024, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                      shape=PolicyShape(hidden_size=256, num_hidden_layers=3, intermediate_size=768))
    build_model(cfg, seed=0).save_pretrained(tmp_path, safe_serialization=True)
    model_cfg = ModelConfig(path=str(tmp_path), enable_gradient_checkpointing=True)
    eager = load_hf_model(model_cfg, torch.bfloat16).cuda().train()
    compiled = copy.deepcopy(eager)
    exact = copy.deepcopy(eager).double()
    ids = torch.randint(3, 1024, (4, 300), generator=torch.Generator().manual_seed(0)).cuda()

    torch._dynamo.reset()
    assert compile_decoder_layers(compiled, zero_stage=2, scope=scope) == modules
    got_logits, got_grads = _logits_and_grads(compiled, ids)
    assert captured_graphs() > 0
    eager_logits, eager_grads = _logits_and_grads(eager, ids)
    ref_logits, ref_grads = _logits_and_grads(exact, ids)

    assert _rel(got_logits, ref_logits) <= 2 * _rel(eager_logits, ref_logits), "logits"
    for name, ref in ref_grads.items():
        assert _rel(got_grads[name], ref) <= 2 * _rel(eager_grads[name], ref) + 1e-12, name


@pytest.mark.parametrize("flash", ["torch", "fa4"])
def test_compiled_layers_on_the_varlen_path_compile_in_the_first_update_and_never_again(monkeypatch, flash):
    """Compiled layers on remove-padding's varlen path, through rounds as an RL step makes them: an inference forward
    (no grad) and a training forward and backward under gradient checkpointing, each round packing other samples to
    another length. Every variant is compiled in the first round; no later round may capture a graph. On one H200
    (session 28) verl's engine compiled the layers on this path until dynamo's limit of 8 and ran eager beyond it,
    when the first layer computed the samples' boundaries (a graph break) and the others reused them from a cache.
    Backend ``aot_eager``: which graphs dynamo captures and when it recompiles is dynamo's, whatever the backend."""
    from repro.data.tiny_model import PolicyShape, build_model, tiny_config
    from repro.workers import varlen
    from repro.workers.layer_compile import captured_graphs, compile_decoder_layers

    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    vocab = 1024
    cfg = tiny_config(vocab_size=vocab, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                      shape=PolicyShape(hidden_size=256, num_hidden_layers=3, intermediate_size=768))
    model = build_model(cfg, seed=0).to("cuda", torch.bfloat16)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert varlen.engage(model, flash, torch.bfloat16, packed_rows=True)
    torch._dynamo.reset()
    assert compile_decoder_layers(model, zero_stage=2, backend="aot_eager") == 3
    gen = torch.Generator().manual_seed(0)
    graphs = []
    try:
        for _ in range(4):
            lengths = torch.randint(20, 200, (int(torch.randint(3, 9, (1,), generator=gen)),), generator=gen)
            pos = torch.cat([torch.arange(int(n)) for n in lengths])[None].cuda()
            ids = torch.randint(3, vocab, pos.shape, generator=gen).cuda()
            model.eval()
            with torch.no_grad():
                model(input_ids=ids, position_ids=pos, use_cache=False)
            model.train()
            model(input_ids=ids, position_ids=pos, use_cache=False).logits.float().logsumexp(-1).mean().backward()
            graphs.append(captured_graphs())
    finally:
        torch._dynamo.reset()
        if varlen.current_impl() != "torch":  # FA4's kernels are process-wide: the next test gets torch's back
            from torch.nn.attention import restore_flash_attention_impl

            restore_flash_attention_impl()
    assert graphs[0] > 0 and graphs[1:] == [graphs[0]] * 3, f"graphs captured after each round: {graphs}"
