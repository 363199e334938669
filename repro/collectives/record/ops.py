"""Which torch.distributed functions the tracer wraps, and how to read each one's arguments.

:data:`OP_SPECS` names every collective and point-to-point entry point of
``torch.distributed.distributed_c10d``; :func:`torch_collective_names` derives the same list from
torch itself (its public functions that take a ``group``), so a test notices when a torch release
adds one that is not covered. What a record reads off the arguments: the process group as the
records name it (:class:`GroupInfo`: a key, the group's name, and its global ranks), dtype
names, a point-to-point op's role (:data:`ROLE`) and peer, and an all-to-all's split sizes
(:func:`split_numels`: what this rank sends to and expects from each group rank, compared
pairwise by :func:`repro.collectives.analyze.findings.split_mismatch`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

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


# -- what a record reads off the arguments ----------------------------------------------------

# A point-to-point op's side of a transfer; the ops that block until it ran.
ROLE = {
    "send": "send",
    "isend": "send",
    "send_object_list": "send",
    "recv": "recv",
    "irecv": "recv",
    "recv_object_list": "recv",
}
BLOCKING = frozenset({"send", "recv", "send_object_list", "recv_object_list", "batch_isend_irecv"})


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class GroupInfo:
    """A process group as the records name it: a key (the group's name) and its global ranks."""

    __slots__ = ("key", "ranks", "member", "obj")

    def __init__(self, group: Any) -> None:
        self.obj = group  # keep it alive so its id() is not reused while cached
        self.member = not c10d._rank_not_in_group(group)
        if self.member:
            pg = group if group is not None else c10d._get_default_group()
            self.key = str(pg.group_name)
            self.ranks = tuple(dist.get_process_group_ranks(pg))
        else:
            self.key, self.ranks = "", ()


def p2p_peer(op: Any, info: GroupInfo) -> int | None:
    """A P2POp's global peer (it may name it by group rank only)."""
    if op.peer is not None:
        return op.peer
    group_peer = getattr(op, "group_peer", None)
    return info.ranks[group_peer] if group_peer is not None else None


def _rows(tensor: Any, splits: list[int] | None, n: int) -> list[int]:
    if tensor.dim() == 0:
        return [tensor.numel()] * n
    per_row = tensor.numel() // max(tensor.shape[0], 1)
    sizes = list(splits) if splits else [tensor.shape[0] // n] * n
    return [int(s) * per_row for s in sizes]


def split_numels(op: str, params: dict[str, Any], n: int) -> list[Any]:
    """``["splits", send, recv]``: elements this rank sends to / receives from each group rank."""
    if op == "all_to_all":
        outs, ins = params.get("output_tensor_list") or [], params.get("input_tensor_list") or []
        return ["splits", [t.numel() for t in ins], [t.numel() for t in outs]]
    out, inp = params.get("output"), params.get("input")
    if out is None or inp is None:
        return []
    return [
        "splits",
        _rows(inp, params.get("input_split_sizes"), n),
        _rows(out, params.get("output_split_sizes"), n),
    ]
