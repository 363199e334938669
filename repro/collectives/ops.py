"""Which torch.distributed functions the tracer wraps, and how to read each one's arguments.

:data:`OP_SPECS` names every collective and point-to-point entry point of
``torch.distributed.distributed_c10d``; :func:`torch_collective_names` derives the same list from
torch itself (its public functions that take a ``group``), so a test notices when a torch release
adds one that is not covered.
"""

from __future__ import annotations

# op -> (parameter names in order, tensor parameter, how to count it, root/peer param, group-rank param, reduce-op param)
TENSOR, LIST, OBJECT, P2P_LIST = "tensor", "list", "object", "p2p_list"
OP_SPECS: dict[str, tuple[tuple[str, ...], str | None, str, str | None, str | None, str | None]] = {
    "all_reduce": (("tensor", "op", "group", "async_op"), "tensor", TENSOR, None, None, "op"),
    "all_reduce_coalesced": (("tensors", "op", "group", "async_op"), "tensors", LIST, None, None, "op"),
    "reduce": (
        ("tensor", "dst", "op", "group", "async_op", "group_dst"),
        "tensor",
        TENSOR,
        "dst",
        "group_dst",
        "op",
    ),
    "broadcast": (
        ("tensor", "src", "group", "async_op", "group_src"),
        "tensor",
        TENSOR,
        "src",
        "group_src",
        None,
    ),
    "all_gather": (("tensor_list", "tensor", "group", "async_op"), "tensor", TENSOR, None, None, None),
    "all_gather_into_tensor": (
        ("output_tensor", "input_tensor", "group", "async_op"),
        "input_tensor",
        TENSOR,
        None,
        None,
        None,
    ),
    "all_gather_single": (
        ("output_tensor", "input_tensor", "group", "async_op"),
        "input_tensor",
        TENSOR,
        None,
        None,
        None,
    ),
    "_all_gather_base": (
        ("output_tensor", "input_tensor", "group", "async_op"),
        "input_tensor",
        TENSOR,
        None,
        None,
        None,
    ),
    "all_gather_coalesced": (
        ("output_tensor_lists", "input_tensor_list", "group", "async_op"),
        "input_tensor_list",
        LIST,
        None,
        None,
        None,
    ),
    "gather": (
        ("tensor", "gather_list", "dst", "group", "async_op", "group_dst"),
        "tensor",
        TENSOR,
        "dst",
        "group_dst",
        None,
    ),
    "scatter": (
        ("tensor", "scatter_list", "src", "group", "async_op", "group_src"),
        "tensor",
        TENSOR,
        "src",
        "group_src",
        None,
    ),
    "reduce_scatter": (
        ("output", "input_list", "op", "group", "async_op"),
        "output",
        TENSOR,
        None,
        None,
        "op",
    ),
    "reduce_scatter_tensor": (
        ("output", "input", "op", "group", "async_op"),
        "output",
        TENSOR,
        None,
        None,
        "op",
    ),
    "reduce_scatter_single": (
        ("output", "input", "op", "group", "async_op"),
        "output",
        TENSOR,
        None,
        None,
        "op",
    ),
    "_reduce_scatter_base": (
        ("output", "input", "op", "group", "async_op"),
        "output",
        TENSOR,
        None,
        None,
        "op",
    ),
    "all_to_all": (
        ("output_tensor_list", "input_tensor_list", "group", "async_op"),
        "input_tensor_list",
        LIST,
        None,
        None,
        None,
    ),
    "all_to_all_single": (
        ("output", "input", "output_split_sizes", "input_split_sizes", "group", "async_op"),
        "input",
        TENSOR,
        None,
        None,
        None,
    ),
    "barrier": (("group", "async_op", "device_ids", "timeout"), None, OBJECT, None, None, None),
    "monitored_barrier": (("group", "timeout", "wait_all_ranks"), None, OBJECT, None, None, None),
    "send": (("tensor", "dst", "group", "tag", "group_dst"), "tensor", TENSOR, "dst", "group_dst", None),
    "isend": (("tensor", "dst", "group", "tag", "group_dst"), "tensor", TENSOR, "dst", "group_dst", None),
    "recv": (("tensor", "src", "group", "tag", "group_src"), "tensor", TENSOR, "src", "group_src", None),
    "irecv": (("tensor", "src", "group", "tag", "group_src"), "tensor", TENSOR, "src", "group_src", None),
    "batch_isend_irecv": (("p2p_op_list",), "p2p_op_list", P2P_LIST, None, None, None),
    "broadcast_object_list": (
        ("object_list", "src", "group", "device", "group_src"),
        None,
        OBJECT,
        "src",
        "group_src",
        None,
    ),
    "all_gather_object": (("object_list", "obj", "group"), None, OBJECT, None, None, None),
    "gather_object": (
        ("obj", "object_gather_list", "dst", "group", "group_dst"),
        None,
        OBJECT,
        "dst",
        "group_dst",
        None,
    ),
    "scatter_object_list": (
        ("scatter_object_output_list", "scatter_object_input_list", "src", "group", "group_src"),
        None,
        OBJECT,
        "src",
        "group_src",
        None,
    ),
    "send_object_list": (
        ("object_list", "dst", "group", "device", "group_dst", "use_batch"),
        None,
        OBJECT,
        "dst",
        "group_dst",
        None,
    ),
    "recv_object_list": (
        ("object_list", "src", "group", "device", "group_src", "use_batch"),
        None,
        OBJECT,
        "src",
        "group_src",
        None,
    ),
}
PEER_OPS = frozenset({"send", "isend", "recv", "irecv", "send_object_list", "recv_object_list"})
# DeepSpeed's TorchBackend keeps these torch functions as attributes chosen at start-up.
DEEPSPEED_CACHED = ("all_gather_function", "reduce_scatter_function")


# Public c10d functions that take a ``group`` but issue no communication.
NOT_COLLECTIVES = frozenset(
    {
        "destroy_process_group",
        "get_backend",
        "get_backend_config",
        "get_global_rank",
        "get_group_rank",
        "get_process_group_ranks",
        "get_rank",
        "get_world_size",
        "new_subgroups",
        "new_subgroups_by_enumeration",
        "shrink_group",
        "split_group",
    }
)


def torch_collective_names() -> set[str]:
    """torch's own list: the public functions of distributed_c10d that take a ``group`` (plus the p2p batch).

    Public means in ``distributed_c10d.__all__``; the deprecated private aliases that torch still
    exports (``_all_gather_base``, ``_reduce_scatter_base``) are wrapped too, as DeepSpeed calls them.
    """
    import inspect
    import warnings

    import torch.distributed.distributed_c10d as c10d

    names = {"batch_isend_irecv"}
    for name in c10d.__all__:
        with warnings.catch_warnings():  # reading the deprecated ``reduce_op`` alias warns
            warnings.simplefilter("ignore", FutureWarning)
            fn = getattr(c10d, name, None)
            if not inspect.isfunction(fn) or name in NOT_COLLECTIVES:
                continue
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            continue
        if "group" in params:
            names.add(name)
    return names
