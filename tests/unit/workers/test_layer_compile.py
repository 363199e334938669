"""Compiled decoder layers are refused, in one line naming the cause, where they could not be what was asked."""

from __future__ import annotations

import pytest
import torch

from repro.workers.layer_compile import compile_decoder_layers


def test_zero3_is_refused_before_anything_is_compiled():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="zero_stage=3 is not valid; choose 0, 1 or 2"):
        compile_decoder_layers(model, zero_stage=3)


def test_a_process_with_dynamo_switched_off_is_refused_instead_of_running_eager(monkeypatch):
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    with pytest.raises(ValueError, match="TORCHDYNAMO_DISABLE=1 makes torch.compile do nothing; unset it"):
        compile_decoder_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)), zero_stage=2)


def test_the_read_backs_count_a_graph_break_and_the_graphs_on_either_side_of_it(monkeypatch):
    from repro.workers.layer_compile import captured_graphs, graph_breaks

    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)  # the suites switch dynamo off (conftest.py)

    def with_a_sync(x):
        return (x * 2) + int(x.sum())  # int(): a host sync, which dynamo cannot trace

    def without(x):
        return x * 2 + 1

    def first(x):
        return x - 1

    torch.compile(first, backend="eager")(torch.ones(3))  # dynamo imported, and its counters, before the deltas
    graphs, breaks = captured_graphs(), graph_breaks()
    torch.compile(without, backend="eager")(torch.ones(3))
    assert (captured_graphs() - graphs, graph_breaks() - breaks) == (1, 0)
    torch.compile(with_a_sync, backend="eager")(torch.ones(3))
    assert graph_breaks() - breaks == 1
    # the break splits the function: a graph before the sync and one resuming after it (how the sum falls between
    # them is dynamo's choice, which torch versions may make differently)
    assert captured_graphs() - graphs >= 3


def test_the_stack_scope_compiles_the_module_holding_the_layers_and_the_layer_scope_each_layer(monkeypatch):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from repro.workers.layer_compile import compiled_layers

    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)  # the suites switch dynamo off (conftest.py)
    cfg = Qwen3Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=8)
    for scope, want in (("layer", ["model.layers.0", "model.layers.1", "model.layers.2"]), ("stack", ["model"])):
        model = Qwen3ForCausalLM(cfg)
        names = {n for n, _ in model.named_parameters()}
        assert compile_decoder_layers(model, zero_stage=1, backend="eager", scope=scope) == len(want) == \
            compiled_layers(model)
        assert sorted(n for n, m in model.named_modules() if getattr(m, "_compiled_call_impl", None)) == want
        assert {n for n, _ in model.named_parameters()} == names  # the checkpoints' names stay the model's


def test_a_compile_scope_outside_its_choices_names_the_key_and_the_choices():
    from repro.config import LayerKernels

    with pytest.raises(ValueError, match=r"compile_scope='model' is not valid; choose one of \['layer', 'stack'\]"):
        LayerKernels(compile_scope="model")
