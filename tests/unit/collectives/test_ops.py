"""Every collective torch exposes is wrapped: the list is derived from torch, so a new API fails here."""

from __future__ import annotations

from repro.collectives.ops import OP_SPECS, torch_collective_names


def test_every_torch_collective_and_p2p_function_has_a_spec():
    missing = torch_collective_names() - set(OP_SPECS)
    assert not missing, f"torch added collectives the tracer does not wrap: {sorted(missing)}"


def test_the_derived_list_holds_the_new_single_tensor_names_and_object_collectives():
    names = torch_collective_names()
    expected = {
        "all_gather_single",
        "reduce_scatter_single",
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

    import torch.distributed.distributed_c10d as c10d

    for op, (params, tensor_param, *_rest) in OP_SPECS.items():
        actual = list(inspect.signature(getattr(c10d, op)).parameters)
        assert actual[: len(params)] == list(params), (op, actual)
        assert tensor_param is None or tensor_param in params
