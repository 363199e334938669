"""Point-to-point ops checked on 2 real gloo ranks: size/dtype pairing and deadlocks, live and in records."""

from __future__ import annotations

import time

import pytest

from repro.collectives_trace import analyze


def _site(marker: str) -> str:
    import pathlib

    lines = pathlib.Path(__file__).read_text().splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if line.rstrip().endswith(f"# p2p:{marker}")]
    assert len(hits) == 1, (marker, hits)
    return f"{pathlib.Path(__file__).name}:{hits[0]}"


def _p2p_step(kind: str, rank: int) -> object:
    import torch
    import torch.distributed as dist

    peer = 1 - rank
    if kind == "size":
        if rank == 0:
            dist.send(torch.ones(4), dst=1)  # p2p:size0
        else:
            dist.recv(torch.zeros(8), src=0)  # p2p:size1
    elif kind == "dtype":
        if rank == 0:
            dist.send(torch.ones(4), dst=1)  # p2p:dtype0
        else:
            dist.recv(torch.zeros(4, dtype=torch.int32), src=0)  # p2p:dtype1
    elif kind == "batch_size":
        n = 4 if rank == 0 else 8
        op = dist.isend if rank == 0 else dist.irecv
        for w in dist.batch_isend_irecv([dist.P2POp(op, torch.ones(n), peer)]):  # p2p:batch
            w.wait()
    elif kind == "recv_recv":
        dist.recv(torch.zeros(4), src=peer)  # p2p:recvrecv
        dist.send(torch.ones(4), dst=peer)
    elif kind == "send_send":
        dist.send(torch.ones(4), dst=peer)  # p2p:sendsend
        dist.recv(torch.zeros(4), src=peer)
    elif kind == "clean_async":
        out = torch.zeros(3)
        works = [dist.isend(torch.full((3,), float(rank)), dst=peer), dist.irecv(out, src=peer)]
        for w in works:
            w.wait()
        return out.tolist()
    elif kind == "clean_batch":
        out = torch.zeros(3)
        ops = [dist.P2POp(dist.isend, torch.full((3,), float(rank)), peer), dist.P2POp(dist.irecv, out, peer)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return out.tolist()
    elif kind == "clean_blocking":
        out = torch.zeros(3)
        if rank == 0:
            dist.send(torch.full((3,), 7.0), dst=1)
            dist.recv(out, src=1)
        else:
            dist.recv(out, src=0)
            dist.send(out * 2, dst=0)
        return out.tolist()
    elif kind == "any_source_dtype":
        if rank == 1:
            dist.send(torch.ones(4), dst=0)  # p2p:anysend
        else:
            dist.recv(torch.zeros(4, dtype=torch.int32))  # p2p:anyrecv
    elif kind == "any_source":
        if rank == 1:
            dist.send(torch.full((3,), 1.0), dst=0)
            dist.send(torch.full((3,), 2.0), dst=0)
            return None
        first, second = torch.zeros(3), torch.zeros(3)
        sender = dist.recv(first)
        work = dist.irecv(second)
        work.wait()
        return [sender, first.tolist(), second.tolist()]
    else:
        raise AssertionError(kind)
    return None


def _p2p_rank(rank: int, world_size: int, kind: str, check: str, out_dir: str) -> dict:
    from repro.collectives.analyze.report import divergence_to_json
    from repro.collectives_trace import CollectiveMismatchError, trace_collectives

    start = time.monotonic()
    try:
        with trace_collectives(out_dir, check=check, timeout_s=20):
            value = _p2p_step(kind, rank)
    except CollectiveMismatchError as exc:
        return {
            "raised": True,
            "json": divergence_to_json(exc.divergence),
            "report": exc.report,
            "elapsed": time.monotonic() - start,
        }
    return {"raised": False, "value": value}


@pytest.mark.parametrize(
    ("kind", "differing", "site0", "site1"),
    [
        ("size", ["numel"], "size0", "size1"),
        ("dtype", ["dtype"], "dtype0", "dtype1"),
        ("batch_size", ["numel"], "batch", "batch"),
    ],
)
def test_check_mode_raises_on_both_ranks_when_a_send_and_its_recv_differ(
    multirank, tmp_path, kind, differing, site0, site1
):
    results = multirank(_p2p_rank, args=(kind, "every", str(tmp_path / "t")), timeout_s=60, deepspeed=False)
    for r in results:
        assert r["raised"], r
        d = r["json"]
        assert d["kind"] == "mismatch" and d["differing"] == differing
        assert (d["rank_a"], d["rank_b"]) == (0, 1) and r["elapsed"] < 10
        assert d["call_a"]["site"].split(" ")[0].endswith(_site(site0)) and d["call_b"]["site"].split(" ")[
            0
        ].endswith(_site(site1))
        assert d["call_a"]["pairs"][0][0] == "send" and d["call_b"]["pairs"][0][0] == "recv"


@pytest.mark.parametrize("kind", ["recv_recv", "send_send"])
def test_check_mode_reports_a_p2p_deadlock_in_seconds_with_both_call_sites(multirank, tmp_path, kind):
    results = multirank(_p2p_rank, args=(kind, "every", str(tmp_path / "t")), timeout_s=60, deepspeed=False)
    marker = kind.replace("_", "")
    for r in results:
        assert r["raised"], r
        d = r["json"]
        assert d["kind"] == "deadlock" and r["elapsed"] < 5, (d["kind"], r["elapsed"])
        assert d["call_a"]["site"].split(" ")[0].endswith(_site(marker)) and d["call_b"]["site"].split(" ")[
            0
        ].endswith(_site(marker))
        assert "Deadlock: rank 0 waits in" in r["report"]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("clean_async", [[1.0] * 3, [0.0] * 3]),
        ("clean_batch", [[1.0] * 3, [0.0] * 3]),
        ("clean_blocking", [[14.0] * 3, [7.0] * 3]),
    ],
)
def test_matching_p2p_runs_clean_in_check_mode_and_waits_are_recorded(multirank, tmp_path, kind, expected):
    from repro.collectives.events import read_trace_dir

    out = tmp_path / "t"
    results = multirank(_p2p_rank, args=(kind, "every", str(out)), timeout_s=60, deepspeed=False)
    assert [r["value"] for r in results] == expected and not any(r["raised"] for r in results)
    traces = read_trace_dir(out)
    assert analyze(out)[1] is None
    if kind != "clean_blocking":
        waits = [c for c in traces[0].calls if c.op == "wait"]
        assert waits and all(w.t_end is not None and w.of is not None for w in waits)


def test_record_mode_analyze_pairs_a_send_with_its_larger_recv(multirank, tmp_path):
    from tests.multirank import RankFailure

    out = tmp_path / "t"
    try:
        multirank(_p2p_rank, args=("size", "off", str(out)), timeout_s=60, deepspeed=False)
    except RankFailure:
        pass  # whether gloo notices the size difference or not, the record tells
    d = analyze(out)[1]
    assert d is not None and d.kind == "mismatch" and d.differing == ["numel"]
    assert (d.call_a.numel, d.call_b.numel) == (4, 8)
    assert d.call_a.site.split(" ")[0].endswith(_site("size0")) and d.call_b.site.split(" ")[0].endswith(
        _site("size1")
    )


def test_receives_from_any_source_learn_their_sender_and_pair_with_its_sends_in_check_mode(
    multirank, tmp_path
):
    from repro.collectives.events import read_trace_dir

    out = tmp_path / "t"
    results = multirank(_p2p_rank, args=("any_source", "every", str(out)), timeout_s=60, deepspeed=False)
    assert not any(r["raised"] for r in results), results
    assert results[0]["value"] == [1, [1.0] * 3, [2.0] * 3]
    traces = read_trace_dir(out)
    received = [c for c in traces[0].calls if c.op in ("recv", "irecv")]
    sent = [c for c in traces[1].calls if c.op == "send"]
    assert [(c.peer, c.pairs[0][:3]) for c in received] == [(1, ["recv", 1, 1]), (1, ["recv", 1, 2])]
    assert [c.pairs[0][:3] for c in sent] == [["send", 0, 1], ["send", 0, 2]]
    assert analyze(out)[1] is None


def test_check_mode_compares_an_any_source_receive_with_the_send_it_took(multirank, tmp_path):
    # Same byte count: gloo delivers it; only the pairing, once the sender is known, sees the dtypes differ.
    results = multirank(
        _p2p_rank, args=("any_source_dtype", "every", str(tmp_path / "t")), timeout_s=60, deepspeed=False
    )
    assert results[0]["raised"], results
    d = results[0]["json"]
    assert d["kind"] == "mismatch" and d["differing"] == ["dtype"] and (d["rank_a"], d["rank_b"]) == (0, 1)
    assert d["call_a"]["pairs"][0][:3] == ["recv", 1, 1] and d["call_b"]["pairs"][0][:3] == ["send", 0, 1]
    assert d["call_a"]["site"].split(" ")[0].endswith(_site("anyrecv"))
    assert d["call_b"]["site"].split(" ")[0].endswith(_site("anysend"))
