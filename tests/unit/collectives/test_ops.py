"""Every collective torch exposes is wrapped: the list is derived from torch, so a new API fails here.

The project claims torch>=2.6 (pyproject). OP_SPECS also names APIs that only newer torch has
(torch 2.13's ``all_gather_single`` and ``reduce_scatter_single``; 2.11 has neither): the tracer
wraps what the running torch has, and these tests check each name against the running torch,
skipping with the reason where it lacks one.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed.distributed_c10d as c10d

from repro.collectives.record.ops import OP_SPECS, torch_collective_names

# Names that appeared after torch 2.6, the oldest torch the project claims.
NEWER_THAN_2_6 = ("all_gather_single", "reduce_scatter_single")


def test_every_torch_collective_and_p2p_function_has_a_spec():
    missing = torch_collective_names() - set(OP_SPECS)
    assert not missing, f"torch added collectives the tracer does not wrap: {sorted(missing)}"


@pytest.mark.parametrize("name", NEWER_THAN_2_6)
def test_the_derived_list_holds_the_newer_single_tensor_names(name):
    if not hasattr(c10d, name):
        pytest.skip(f"torch {torch.__version__} has no torch.distributed.{name}")
    assert name in torch_collective_names()


def test_the_derived_list_holds_the_single_tensor_names_and_object_collectives():
    names = torch_collective_names()
    expected = {
        "all_to_all_single",
        "all_reduce_coalesced",
        "reduce_scatter_tensor",
        "all_gather_into_tensor",
        "monitored_barrier",
        "all_gather_object",
        "batch_isend_irecv",
        "send",
        "irecv",
    }
    assert expected <= names
    assert not names & {"get_rank", "new_group", "destroy_process_group"}


def test_every_spec_names_real_parameters_of_the_torch_function():
    import inspect

    missing = set(OP_SPECS) - {op for op in OP_SPECS if hasattr(c10d, op)}
    # Only the newer names may be missing: any other absence is a wrong spec, not an older torch.
    assert missing <= set(NEWER_THAN_2_6), sorted(missing)
    for op, (params, tensor_param, *_rest) in OP_SPECS.items():
        if op in missing:
            continue
        actual = list(inspect.signature(getattr(c10d, op)).parameters)
        # The specs follow the newest torch; an older one may lack trailing parameters (torch 2.11's
        # barrier has no timeout), never have others in their place.
        shared = min(len(actual), len(params))
        assert actual[:shared] == list(params[:shared]), (op, actual)
        assert tensor_param is None or tensor_param in actual, (op, actual)
        assert tensor_param is None or tensor_param in params
