"""Any-source receives in the records: the ``source`` event pairs them, an unreceived send is a finding."""

from __future__ import annotations

import json

from repro.collectives.analyze.report import format_divergence
from repro.collectives_trace import analyze

RANKS = [0, 1, 2]


def _p2p(rank: int, index: int, op: str, peer: int | None, seq: int | None, site: str, t: float) -> dict:
    role = "send" if op == "send" else "recv"
    return {
        "ev": "call",
        "rank": rank,
        "index": index,
        "op": op,
        "group": "0",
        "ranks": RANKS,
        "group_seq": None,
        "numel": 4,
        "dtype": "float32",
        "site": site,
        "t": t,
        "peer": peer,
        "pairs": [[role, peer, seq, 4, "float32", op]],
    }


def _barrier(rank: int, index: int, t: float) -> dict:
    return {
        "ev": "call",
        "rank": rank,
        "index": index,
        "op": "barrier",
        "group": "0",
        "ranks": RANKS,
        "group_seq": 1,
        "numel": 0,
        "dtype": "",
        "site": "job.py:30 finish",
        "t": t,
    }


def _write(tmp_path, events: dict[int, list[dict]]) -> None:
    for rank, evs in events.items():
        head = [{"ev": "meta", "rank": rank, "world_size": 3}, {"ev": "group", "group": "0", "ranks": RANKS}]
        (tmp_path / f"rank{rank}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in head + evs))


def _collector() -> list[dict]:
    """Rank 0 collecting from any source: its first receive learned rank 1 as the sender, its second waits."""
    return [
        _p2p(0, 1, "recv", None, None, "job.py:12 collect", 1.0),
        {"ev": "ret", "index": 1, "t": 1.5},
        {"ev": "source", "index": 1, "peer": 1, "seq": 1},
        _p2p(0, 2, "recv", None, None, "job.py:12 collect", 2.0),
    ]


def test_a_send_to_the_wrong_peer_is_reported_with_the_send_and_where_the_receiver_waits(tmp_path):
    # rank 2 means to send to rank 0, which collects from any source, but names rank 1.
    _write(
        tmp_path,
        {
            0: _collector(),
            1: [
                _p2p(1, 1, "send", 0, 1, "job.py:20 work", 1.1),
                {"ev": "ret", "index": 1, "t": 1.5},
                _barrier(1, 2, 1.6),
            ],
            2: [_p2p(2, 1, "send", 1, 1, "job.py:20 work", 1.2)],
        },
    )
    traces, d = analyze(tmp_path)
    assert traces[0].calls[0].peer == 1 and traces[0].calls[0].pairs[0][:3] == ["recv", 1, 1]
    assert d is not None and d.kind == "unreceived" and (d.rank_a, d.rank_b) == (2, 1)
    text = format_divergence(d)
    assert text.startswith(
        "Rank 2's send #1 to rank 1 (send numel=4 float32 peer=1 at job.py:20 work) was never"
    )
    assert "it received nothing from rank 2; it waits in barrier numel=0  at job.py:30 finish" in text


def test_a_learned_any_source_receive_pairs_with_its_send_and_a_waiting_one_may_still_take_it(tmp_path):
    _write(
        tmp_path,
        {
            0: _collector(),
            1: [_p2p(1, 1, "send", 0, 1, "job.py:20 work", 1.1), {"ev": "ret", "index": 1, "t": 1.5}],
            2: [_p2p(2, 1, "send", 0, 1, "job.py:20 work", 1.2)],
        },
    )
    d = analyze(tmp_path)[1]
    # Not "unreceived": rank 0's second any-source receive still waits; the hang names it.
    assert d is not None and d.kind == "hang", d
