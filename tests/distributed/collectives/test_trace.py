"""The collective tracer on real gloo ranks: live check, record + analyze, CLI, Flight Recorder (the seed's ZeRO-2 hang:
``test_trace_zero2.py``)."""

from __future__ import annotations

import json
import pathlib
import textwrap
import time

import pytest

from repro.collectives_trace import analyze
from tests.distributed.collectives.trace_cli import run_cli
from tests.multirank import RankFailure


def _diverge(kind: str, rank: int) -> None:
    """The divergent step of each scenario; the line numbers below are what the reports must name."""
    import torch
    import torch.distributed as dist

    if kind == "size":
        dist.all_reduce(torch.ones(1 if rank == 0 else 8))  # site:size
    elif kind == "dtype":
        dist.all_reduce(torch.ones(4, dtype=torch.float32 if rank == 0 else torch.int32))  # site:dtype
    elif kind == "op":
        if rank == 0:
            dist.all_reduce(torch.ones(4))  # site:op0
        else:
            dist.broadcast(torch.ones(4), src=0)  # site:op1
    elif kind == "extra":
        if rank == 0:
            dist.barrier()  # site:extra0 (the extra call)
        dist.all_reduce(torch.ones(4))  # site:extra1
    elif kind == "missing":
        if rank == 0:
            dist.all_reduce(torch.ones(4))  # site:missing (rank 1 never issues this one)
    else:
        raise AssertionError(kind)


def _check_rank(rank: int, world_size: int, kind: str, out_dir: str, timeout_s: float) -> dict:
    import torch
    import torch.distributed as dist

    from repro.collectives.analyze.report import divergence_to_json
    from repro.collectives_trace import CollectiveMismatchError, trace_collectives

    start = None
    try:
        with trace_collectives(out_dir, check="every", timeout_s=timeout_s):
            dist.all_reduce(torch.ones(4))  # agreed by both ranks
            start = time.monotonic()
            _diverge(kind, rank)
    except CollectiveMismatchError as exc:
        return {
            "raised": True,
            "report": exc.report,
            "json": divergence_to_json(exc.divergence),
            "elapsed": time.monotonic() - start,
        }
    return {"raised": False, "elapsed": time.monotonic() - start}


def _site_line(marker: str) -> str:
    """``test_trace.py:<line> _diverge`` for the line of ``_diverge`` tagged ``# site:<marker>``."""
    lines = pathlib.Path(__file__).read_text().splitlines()
    hits = [
        i + 1
        for i, line in enumerate(lines)
        if line.split("# site:")[-1].split(" ")[0] == marker and "# site:" in line
    ]
    assert len(hits) == 1, (marker, hits)
    return f"{pathlib.Path(__file__).name}:{hits[0]} _diverge"


@pytest.mark.parametrize(
    ("kind", "differing", "site0", "site1"),
    [
        ("size", ["numel"], "size", "size"),
        ("dtype", ["dtype"], "dtype", "dtype"),
        ("op", ["op", "root", "redop"], "op0", "op1"),
        ("extra", ["op", "numel", "dtype", "redop"], "extra0", "extra1"),
    ],
)
def test_check_mode_reports_mismatch_on_both_ranks_with_both_call_sites(
    multirank, tmp_path, kind, differing, site0, site1
):
    results = multirank(_check_rank, args=(kind, str(tmp_path / "trace"), 10.0), timeout_s=60)
    for r in results:
        assert r["raised"], r
        assert r["elapsed"] < 10.0
        d = r["json"]
        assert d["kind"] == "mismatch"
        assert d["differing"] == differing
        assert (d["rank_a"], d["rank_b"]) == (0, 1)
    d = results[0]["json"]
    # Both call sites, as file:line function, point at the divergent lines.
    for call, marker in ((d["call_a"], site0), (d["call_b"], site1)):
        assert call["site"].endswith(_site_line(marker)), (call["site"], marker)
        assert call["site"] in results[1]["report"]
    assert results[0]["report"] == results[1]["report"].replace("on rank 1", "on rank 0")


def test_check_mode_reports_a_rank_that_never_arrives_with_its_last_call(multirank, tmp_path):
    results = multirank(_check_rank, args=("missing", str(tmp_path / "trace"), 3.0), timeout_s=60)
    r0, r1 = results
    assert not r1["raised"]  # rank 1 left the traced block; rank 0 waits for it in vain
    assert r0["raised"] and 3.0 <= r0["elapsed"] < 10.0
    d = r0["json"]
    assert d["kind"] == "timeout" and d["missing_ranks"] == [1]
    assert d["call_a"]["site"].endswith(_site_line("missing"))
    # rank 1's last checked call is the agreed first all_reduce
    assert d["last_b"]["group_seq"] == 1 and d["last_b"]["site"].endswith("_check_rank")
    assert "Rank 1 did not reach all_reduce (call #2" in r0["report"]


def _subgroup_rank(rank: int, world_size: int, out_dir: str) -> dict:
    import torch
    import torch.distributed as dist

    from repro.collectives.analyze.report import divergence_to_json
    from repro.collectives_trace import CollectiveMismatchError, trace_collectives

    sub = dist.new_group([1, 2])
    if rank == 0:
        return {"raised": False}
    start = time.monotonic()
    try:
        with trace_collectives(out_dir, check="every", timeout_s=10):
            t = torch.ones(4)
            dist.broadcast(t, group=sub, group_src=1)  # group rank 1 is global rank 2
            dist.all_reduce(torch.ones(4 if rank == 1 else 2), group=sub)
    except CollectiveMismatchError as exc:
        return {
            "raised": True,
            "json": divergence_to_json(exc.divergence),
            "elapsed": time.monotonic() - start,
        }
    return {"raised": False}


def test_check_mode_reports_subgroup_mismatch_with_global_ranks(multirank, tmp_path):
    out = tmp_path / "trace"
    results = multirank(_subgroup_rank, world_size=3, args=(str(out),), timeout_s=60)
    assert not results[0]["raised"]
    for r in results[1:]:
        assert r["raised"] and r["elapsed"] < 10.0
        d = r["json"]
        assert d["ranks"] == [1, 2] and (d["rank_a"], d["rank_b"]) == (1, 2)
        assert (d["call_a"]["numel"], d["call_b"]["numel"]) == (4, 2)
        assert d["before"][0][0]["op"] == "broadcast" and d["before"][0][0]["root"] == 2
    assert not (out / "rank0.jsonl").exists()  # rank 0 issued nothing traced


def _record_size_mismatch_rank(rank: int, world_size: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from repro.collectives_trace import trace_collectives

    with trace_collectives(out_dir, check="off"):
        dist.all_reduce(torch.ones(4))
        _diverge("size", rank)


def test_record_mode_trace_survives_the_gloo_abort_and_analyze_finds_the_size_mismatch(multirank, tmp_path):
    out = tmp_path / "trace"
    with pytest.raises(RankFailure):
        multirank(_record_size_mismatch_rank, args=(str(out),), timeout_s=60)
    traces, d = analyze(out)
    assert sorted(traces) == [0, 1]
    assert d is not None and d.kind == "mismatch" and d.differing == ["numel"]
    assert (d.call_a.numel, d.call_b.numel) == (1, 8)
    assert d.call_a.site.endswith(_site_line("size"))
    assert d.before[0][0].numel == 4


def _flight_recorder_rank(rank: int, world_size: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(4))
    _diverge("dtype", rank)  # gloo completes this one and returns garbage
    dist.barrier()
    dump = torch._C._distributed_c10d._dump_fr_trace()
    pathlib.Path(out_dir, f"fr_trace_rank_{rank}").write_bytes(dump)


def test_flight_recorder_dump_from_gloo_is_analyzed(multirank, tmp_path):
    out = tmp_path / "fr"
    out.mkdir()
    multirank(_flight_recorder_rank, args=(str(out),), env={"TORCH_FR_BUFFER_SIZE": "64"}, deepspeed=False)
    traces, d = analyze(out)
    assert sorted(traces) == [0, 1] and traces[0].meta["format"] == "flight_recorder"
    assert d is not None and d.kind == "mismatch" and d.differing == ["dtype"]
    assert (d.call_a.dtype, d.call_b.dtype) == ("float32", "int32")
    assert d.call_a.site.endswith(_site_line("dtype"))


def test_cli_launch_reports_divergence_then_analyze_and_export_agree(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent("""
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        dist.all_reduce(torch.ones(4))
        if rank == 0:
            dist.all_reduce(torch.ones(3))
        else:
            dist.all_reduce(torch.ones(5))
    """)
    )
    out = tmp_path / "trace"
    done = run_cli(
        ["launch", "--nproc-per-node", "2", "--check", "every", "--out", str(out), "--", str(script)],
        tmp_path,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "Collective mismatch" in done.stdout
        and "job.py:7 <module>" in done.stdout
        and "job.py:9 <module>" in done.stdout
    )
    assert "SIGABRT" not in done.stdout
    report = json.loads(run_cli(["analyze", str(out), "--json"], tmp_path).stdout)["divergence"]
    assert (report["call_a"]["numel"], report["call_b"]["numel"]) == (3, 5)
    chrome = tmp_path / "t.json"
    assert run_cli(["export", str(out), "--chrome", str(chrome)], tmp_path).returncode == 0
    marked = [e for e in json.loads(chrome.read_text())["traceEvents"] if e.get("cname") == "terrible"]
    assert {e.get("pid") for e in marked} == {0, 1}


@pytest.mark.parametrize("form", ["script", "module"])
def test_cli_launch_exits_zero_when_ranks_agree(tmp_path, form):
    script = tmp_path / "ok_job.py"
    script.write_text(
        "import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
        "dist.all_reduce(torch.ones(2))\ndist.barrier()\ndist.destroy_process_group()\n"
    )
    # -m: the ranks find the module as python -m does, from the working directory (tmp_path).
    target = [str(script)] if form == "script" else ["-m", "ok_job"]
    done = run_cli(["launch", "--nproc-per-node", "2", "--out", str(tmp_path / "t"), "--", *target], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all 2 ranks exited 0; no divergence (rank 0: 2 calls; rank 1: 2 calls)" in done.stdout, (
        done.stdout
    )


def _strided_rank(rank: int, world_size: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from repro.collectives_trace import trace_collectives

    x = torch.arange(12.0).view(3, 4)
    with trace_collectives(out):
        parts = [torch.empty(3, 2) for _ in range(world_size)]
        dist.all_gather(parts, x[:, ::2])  # a strided view: gloo takes it, NCCL would raise
        dist.all_reduce(x[:, :2].contiguous())


def test_a_strided_tensor_is_recorded_and_noted_as_what_nccl_would_refuse(pooled, tmp_path, capsys):
    """Clean on gloo, a failure on GPUs: the record names the parameter that held a non-contiguous
    tensor and ``analyze`` notes it (seen for real: Ulysses' positions, results/gpu_gate/layouts_2gpu/)."""
    from repro.collectives.cli import main
    from repro.collectives.events import read_trace_dir

    out = tmp_path / "trace"
    pooled(_strided_rank, 2, timeout_s=60, args=(str(out),))
    traces = read_trace_dir(out)
    for rank in (0, 1):
        gather, reduce = traces[rank].calls
        assert (gather.op, gather.strided) == ("all_gather", ["tensor"]), gather
        assert (reduce.op, reduce.strided) == ("all_reduce", []), reduce
    assert main(["analyze", str(out)]) == 0  # not a divergence: the ranks agree
    notes = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("note:")]
    assert len(notes) == 2 and all("all_gather" in n and "`tensor`" in n and "test_trace.py" in n for n in notes), notes
