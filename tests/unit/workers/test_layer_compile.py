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
