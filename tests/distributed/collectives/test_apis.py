"""Every collective API on 2 real gloo ranks in check mode: each divergent call raised, each clean twin clean.

One process group runs all scenarios in turn, each in its own trace session: check mode raises
before the real call on both ranks, so the group stays usable for the next scenario.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as torch_dist

# The single-tensor names torch 2.13 added (2.11 has neither; the project claims torch>=2.6):
# they run as a test of their own, which skips where the running torch lacks one.
NEWER_APIS = ("all_gather_single", "reduce_scatter_single")

# scenario -> the field the report must name as differing
DIVERGENT = {
    "all_gather_single": ["numel"],
    "reduce_scatter_single": ["numel"],
    "all_gather_into_tensor": ["numel"],
    "reduce_scatter_tensor": ["dtype"],
    "all_reduce_coalesced": ["numel"],
    "all_to_all_single_splits": ["splits"],
    "all_to_all_splits": ["splits"],
    "monitored_barrier": ["op", "numel", "dtype", "redop"],
    "all_gather_object": ["op", "root"],
    "async_all_reduce": ["numel"],
}


def _call(name: str, rank: int, divergent: bool) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    odd = divergent and rank == 1
    n = 6 if odd else 4
    if name == "all_gather_single":
        dist.all_gather_single(torch.zeros(2 * n), torch.ones(n))
    elif name == "reduce_scatter_single":
        dist.reduce_scatter_single(torch.zeros(n), torch.ones(2 * n))
    elif name == "all_gather_into_tensor":
        dist.all_gather_into_tensor(torch.zeros(2 * n), torch.ones(n))
    elif name == "reduce_scatter_tensor":
        dtype = torch.float64 if odd else torch.float32
        dist.reduce_scatter_tensor(torch.zeros(4, dtype=dtype), torch.ones(8, dtype=dtype))
    elif name == "all_reduce_coalesced":
        dist.all_reduce_coalesced([torch.ones(2), torch.ones(n)])
    elif name == "all_to_all_single_splits":
        # rank 0 sends 1 row to itself and 3 to rank 1; rank 1 expects 3 from rank 0 (2 when divergent)
        splits_in = [1, 3] if rank == 0 else [2, 2]
        splits_out = [1, 2] if rank == 0 else [2 if odd else 3, 2]
        dist.all_to_all_single(
            torch.zeros(sum(splits_out), 2), torch.ones(sum(splits_in), 2), splits_out, splits_in
        )
    elif name == "all_to_all_splits":
        # (gloo wants equal per-peer sizes; rank 1 expecting 3 from rank 0 is the divergence)
        outs = [torch.zeros(3 if odd else 2), torch.zeros(2)]
        dist.all_to_all(outs, [torch.ones(2), torch.ones(2)])
    elif name == "monitored_barrier":
        if odd:
            dist.all_reduce(torch.ones(1))
        else:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    elif name == "all_gather_object":
        out = [None, None]
        if odd:
            dist.broadcast_object_list(out, src=0)
        else:
            dist.all_gather_object(out, {"rank": rank})
    elif name == "async_all_reduce":
        dist.all_reduce(torch.ones(n), async_op=True).wait()
    else:
        raise AssertionError(name)


def _gloo_lacks_list_all_to_all() -> str | None:
    """torch 2.11's gloo has all_to_all_single but not the list form (2.13 added it); the reason, or None."""
    import torch
    import torch.distributed as dist

    try:
        dist.all_to_all([torch.zeros(1)] * dist.get_world_size(), [torch.zeros(1)] * dist.get_world_size())
    except RuntimeError as exc:
        if "does not support alltoall" in str(exc):
            return f"gloo in torch {torch.__version__} does not support all_to_all (the list form)"
        raise
    return None


def _apis_rank(rank: int, world_size: int, out_dir: str, names: list[str]) -> dict:
    from repro.collectives_trace import CollectiveMismatchError, trace_collectives

    results = {}
    if "all_to_all_splits" in names and (lacking := _gloo_lacks_list_all_to_all()):
        return {"skip": lacking}
    for divergent in (False, True):
        for name in names:
            try:
                with trace_collectives(f"{out_dir}/{name}-{divergent}", check="every", timeout_s=20):
                    _call(name, rank, divergent)
                results[name, divergent] = None
            except CollectiveMismatchError as exc:
                d = exc.divergence
                results[name, divergent] = (
                    d.kind,
                    d.differing,
                    d.call_a.op,
                    d.call_b.op if d.call_b else None,
                )
    return results


@pytest.mark.parametrize("apis", ["core", "newer", "all_to_all_list"])
def test_each_collective_api_is_checked_and_its_clean_twin_runs_clean(multirank, tmp_path, apis):
    from repro.collectives_trace import analyze

    if apis == "newer":
        lacking = [name for name in NEWER_APIS if not hasattr(torch_dist, name)]
        if lacking:
            pytest.skip(f"torch {torch.__version__} has no torch.distributed.{', '.join(lacking)}")
        names = list(NEWER_APIS)
    elif apis == "all_to_all_list":
        names = ["all_to_all_splits"]
    else:
        names = [name for name in DIVERGENT if name not in NEWER_APIS and name != "all_to_all_splits"]
    results = multirank(_apis_rank, args=(str(tmp_path / "t"), names), timeout_s=120, deepspeed=False)
    if "skip" in results[0]:
        pytest.skip(results[0]["skip"])
    for name in names:
        differing = DIVERGENT[name]
        assert results[0][name, False] is None and results[1][name, False] is None, name
        assert analyze(tmp_path / "t" / f"{name}-False")[1] is None, name
        for r in results:
            found = r[name, True]
            assert found is not None, name
            assert found[0] == "mismatch" and found[1] == differing, (name, found)
