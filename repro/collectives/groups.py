"""Process groups as the records name them: a key (the group's name) and its global ranks."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class GroupInfo:
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
