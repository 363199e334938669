"""Functional collectives and DTensor on 2 real gloo ranks: traced with the user's line, checked, waits matched."""

from __future__ import annotations

import pathlib

import pytest

from repro.collectives_trace import analyze
from tests.multirank import RankFailure


def _site(marker: str) -> str:
    lines = pathlib.Path(__file__).read_text().splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if line.rstrip().endswith(f"# fc:{marker}")]
    assert len(hits) == 1, (marker, hits)
    return f"{pathlib.Path(__file__).name}:{hits[0]}"


def _functional_step(kind: str, rank: int, divergent: bool) -> list:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    n = 6 if divergent and rank == 1 else 4
    if kind == "funcol":
        out = funcol.all_reduce(torch.ones(n), "sum", dist.group.WORLD)  # fc:funcol
        return (out * 1).tolist()  # using the result waits for it
    if kind == "dtensor":
        mesh = init_device_mesh("cpu", (2,))
        local = torch.full((n // 2, 2), float(rank))
        dt = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
        full = dt.redistribute(mesh, [Replicate()]).to_local()  # fc:dtensor
        return full.sum(dim=1).tolist()
    raise AssertionError(kind)


def _functional_rank(
    rank: int, world_size: int, kind: str, check: str, divergent: bool, out_dir: str
) -> dict:
    from repro.collectives.report import divergence_to_json
    from repro.collectives_trace import CollectiveMismatchError, trace_collectives

    try:
        with trace_collectives(out_dir, check=check, timeout_s=20):
            value = _functional_step(kind, rank, divergent)
    except CollectiveMismatchError as exc:
        return {"raised": True, "json": divergence_to_json(exc.divergence), "report": exc.report}
    return {"raised": False, "value": value}


@pytest.mark.parametrize(("kind", "op"), [("funcol", "all_reduce"), ("dtensor", "all_gather_into_tensor")])
def test_check_mode_raises_on_both_ranks_at_the_users_functional_or_dtensor_line(
    multirank, tmp_path, kind, op
):
    results = multirank(_functional_rank, args=(kind, "every", True, str(tmp_path / "t")), deepspeed=False)
    for r in results:
        assert r["raised"], r
        d = r["json"]
        assert d["kind"] == "mismatch" and d["differing"] == ["numel"] and d["call_a"]["op"] == op
        for call in (d["call_a"], d["call_b"]):
            assert call["site"].split(" ")[0].endswith(_site(kind)), call["site"]
            assert "_functional_rank" in " ".join(call["stack"])  # the caller's frame too


@pytest.mark.parametrize(("kind", "expected"), [("funcol", [2.0] * 4), ("dtensor", [0.0, 0.0, 2.0, 2.0])])
def test_clean_functional_and_dtensor_runs_record_the_call_and_its_wait_tensor(
    multirank, tmp_path, kind, expected
):
    from repro.collectives.events import read_trace_dir

    out = tmp_path / "t"
    results = multirank(_functional_rank, args=(kind, "every", False, str(out)), deepspeed=False)
    assert [r["value"] for r in results] == [expected, expected]
    assert analyze(out)[1] is None
    calls = read_trace_dir(out)[0].calls
    coll = [c for c in calls if c.group_seq is not None]
    waits = [c for c in calls if c.op == "wait"]
    assert coll and coll[-1].site.split(" ")[0].endswith(_site(kind))
    assert waits and waits[-1].of == coll[-1].index and waits[-1].t_end is not None


def test_record_mode_analyze_finds_the_functional_size_mismatch(multirank, tmp_path):
    out = tmp_path / "t"
    try:
        multirank(_functional_rank, args=("funcol", "off", True, str(out)), deepspeed=False)
    except RankFailure:
        pass  # gloo may or may not abort on the size difference; the record tells either way
    d = analyze(out)[1]
    assert d is not None and d.kind == "mismatch" and d.differing == ["numel"]
    assert d.call_a.site.split(" ")[0].endswith(_site("funcol"))
