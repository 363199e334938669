"""``enable_gradient_checkpointing=auto``'s parts on one process: the saved-bytes count against sizes worked out by
hand, the rule, the largest micro-batch of a plan, the config key's choices."""

from __future__ import annotations

import types

import pytest
import torch

from repro.config.roles import ModelConfig
from repro.workers import activation_checkpointing as ac


def _mlp(d_in: int, hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(d_in, hidden, bias=False), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 1, bias=False))


@pytest.mark.parametrize("tokens", [8, 40])
def test_saved_bytes_count_each_activation_once_and_no_weight(tokens):
    # Linear -> ReLU -> Linear on [tokens, 24] fp32: autograd keeps the input (for the first weight's gradient) and
    # the ReLU's output (its own backward and the second weight's gradient: one storage); the second weight, saved
    # for the ReLU output's gradient, counts nothing (counted, it would add 40 x 4 / tokens bytes).
    mlp = _mlp(24, 40)
    x = torch.randn(tokens, 24)
    per_token = ac.saved_bytes_per_token(lambda: mlp(x), tokens, mlp)
    assert per_token == (24 + 40) * 4


def test_saved_bytes_leave_out_weights_gathered_into_new_storage_during_the_forward():
    # ZeRO-3 swaps each parameter's data for the gathered weight just before its module runs: a storage the
    # parameter holds only from then on. The count reads the parameters at the moment a tensor is saved.
    # The second linear's weight is what autograd saves (the input's gradient needs it; the first's input needs none).
    mlp = _mlp(16, 32)
    x = torch.randn(10, 16)
    second = mlp[2]

    def gathered_forward():
        second.weight.data = second.weight.data.clone()  # new storage, as a gather gives
        return mlp(x)

    assert ac.saved_bytes_per_token(gathered_forward, 10, mlp) == (16 + 32) * 4


def test_the_rule_turns_checkpointing_on_only_when_the_activations_with_headroom_and_a_gradient_do_not_fit():
    per_token, tokens, grad = 1000.0, 4096, 10**6
    fits = int(per_token * tokens * ac.HEADROOM) + grad
    assert not ac.needs_checkpointing(per_token, tokens, grad, fits)
    assert ac.needs_checkpointing(per_token, tokens, grad, fits - 1)


@pytest.mark.parametrize(("dynamic", "max_token_len", "micro", "sp", "want"), [
    (True, 8192, 1, 1, 8192),   # ppo_max_token_len_per_gpu is a rank's budget
    (True, 8192, 1, 2, 4096),   # the plan holds it over the SP group; each rank gets its slice
    (False, None, 4, 1, 4 * 768),
    (False, None, 4, 2, 4 * 768 // 2),
])
def test_the_largest_micro_batch_of_a_plan(dynamic, max_token_len, micro, sp, want):
    plan = types.SimpleNamespace(dynamic=dynamic, max_token_len=max_token_len, micro=micro, sp=sp)
    assert ac.largest_micro_tokens(plan, 768) == want


def test_the_key_takes_true_false_or_auto_and_names_the_choices_otherwise():
    for value in (True, False, "auto"):
        assert ModelConfig(enable_gradient_checkpointing=value).enable_gradient_checkpointing == value
    with pytest.raises(ValueError, match=r"enable_gradient_checkpointing.*\[True, False, 'auto'\]"):
        ModelConfig(enable_gradient_checkpointing="sometimes")
