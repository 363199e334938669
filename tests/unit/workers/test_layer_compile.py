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
