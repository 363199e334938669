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
    import os

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
    if kind == "fake":
        from torch._subclasses.fake_tensor import FakeTensorMode

        # What torch.compile's tracing does: the ops on fake tensors under its modes, nothing on the wire,
        # here a different op on each rank; then one real call.
        with FakeTensorMode():
            x = torch.ones(4)
            _ = funcol.all_gather_tensor(x, 0, dist.group.WORLD) if rank else funcol.all_reduce(x, "sum", dist.group.WORLD)
        return (funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD) * 1).tolist()  # fc:real
    if kind.startswith("compiled_"):
        group = dist.group.WORLD

        def sync(x):
            if divergent and rank == 1:
                return funcol.all_gather_tensor(x, 0, group)  # fc:compiled1
            return funcol.all_reduce(x, "sum", group)  # fc:compiled0

        backend = kind.removeprefix("compiled_")
        # The suites set TORCHDYNAMO_DISABLE=1 (conftest.py), which makes torch.compile a no-op; this
        # rank process is this test's alone.
        os.environ.pop("TORCHDYNAMO_DISABLE", None)
        return torch.compile(sync, backend=backend, fullgraph=True)(torch.ones(4)).tolist()
    raise AssertionError(kind)


def _functional_rank(
    rank: int, world_size: int, kind: str, check: str, divergent: bool, out_dir: str
) -> dict:
    from repro.collectives.analyze.report import divergence_to_json
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


def _compiled_rank(rank: int, world_size: int, backend: str, divergent: bool, out_dir: str) -> dict:
    import torch._dynamo

    result = _functional_rank(rank, world_size, f"compiled_{backend}", "every", divergent, out_dir)
    return {**result, "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"]}


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_compiled_function_issuing_another_collective_on_one_rank_raises_at_its_lines(
    multirank, tmp_path, backend
):
    results = multirank(_compiled_rank, args=(backend, True, str(tmp_path / "t")), deepspeed=False)
    for r in results:
        assert r["raised"], r
        d = r["json"]
        assert d["kind"] == "mismatch" and "op" in d["differing"]
        assert r["graphs"] >= 1  # compiled, not run eagerly
        assert (d["call_a"]["op"], d["call_b"]["op"]) == ("all_reduce", "all_gather_into_tensor")
        assert d["call_a"]["site"].endswith(f"{_site('compiled0')} sync"), d["call_a"]["site"]
        assert d["call_b"]["site"].endswith(f"{_site('compiled1')} sync"), d["call_b"]["site"]
        assert "_functional_step" in " ".join(d["call_a"]["stack"])  # the frames that called the compiled one


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_clean_compiled_function_records_its_collective_and_wait_at_the_users_line(
    multirank, tmp_path, backend
):
    from repro.collectives.events import read_trace_dir

    out = tmp_path / "t"
    results = multirank(_compiled_rank, args=(backend, False, str(out)), deepspeed=False)
    assert [r["value"] for r in results] == [[2.0] * 4, [2.0] * 4]
    assert analyze(out)[1] is None
    calls = read_trace_dir(out)[0].calls
    assert [c.op for c in calls] == ["all_reduce", "wait"]
    assert all(r["graphs"] >= 1 for r in results)  # compiled, not run eagerly
    # the wait is where the result was first used: in the graph, or where the caller uses it
    assert calls[0].site.endswith(f"{_site('compiled0')} sync"), calls[0].site
    assert calls[1].of == calls[0].index and calls[1].t_end is not None


def test_calls_on_fake_tensors_under_torchs_tracing_modes_are_neither_recorded_nor_checked(multirank, tmp_path):
    """torch 2.11's AOT tracing called the namespace wrapper on fake tensors: a clean compiled run recorded its
    collective twice, and a divergent one raised while compiling instead of at its run (seen on the GPU machine's
    CPU suite)."""
    from repro.collectives.events import read_trace_dir

    out = tmp_path / "t"
    results = multirank(_functional_rank, args=("fake", "every", False, str(out)), deepspeed=False)
    assert [r["raised"] for r in results] == [False, False], results
    assert [r["value"] for r in results] == [[2.0] * 4, [2.0] * 4]
    traces = read_trace_dir(out)
    assert sorted(traces) == [0, 1]
    for trace in traces.values():
        assert [c.op for c in trace.calls] == ["all_reduce", "wait"], trace.calls
        assert trace.calls[0].site.split(" ")[0].endswith(_site("real")), trace.calls[0].site
