"""Text and JSON reports of a divergence."""

from __future__ import annotations

import json

from repro.collectives.analyze.align import first_divergence
from repro.collectives.analyze.report import divergence_from_json, divergence_to_json, format_divergence
from tests.unit.collectives.helpers import call, trace


def _mismatch():
    a = trace(0, [("all_reduce", 4), ("all_reduce", 1, "actor.py:88 update_policy")])
    b = trace(1, [("all_reduce", 4), ("all_reduce", 4096, "actor.py:80 update_policy")])
    b.calls[-1].lib_site = "deepspeed/runtime/zero/stage_1_and_2.py:2384 allreduce_bucket"
    return first_divergence({0: a, 1: b})


def test_text_report_shows_both_calls_side_by_side_and_marks_differing_fields():
    text = format_divergence(_mismatch())
    first = text.splitlines()[0]
    assert "rank 0 issued all_reduce numel=1" in first and "rank 1 issued all_reduce numel=4096" in first
    row = next(line for line in text.splitlines() if line.strip().startswith("site"))
    assert "actor.py:88 update_policy" in row and "actor.py:80 update_policy" in row
    assert any(line.strip().startswith("numel*") for line in text.splitlines())
    assert "stage_1_and_2.py:2384 allreduce_bucket" in text
    assert "calls before it" in text


def test_json_report_round_trips():
    d = _mismatch()
    data = json.loads(json.dumps(divergence_to_json(d)))
    assert data["kind"] == "mismatch" and data["differing"] == ["numel"]
    back = divergence_from_json(data)
    assert format_divergence(back) == format_divergence(d)


def test_crossed_groups_headline_names_both_groups():
    a = call(0, 1, numel=1, group="0")
    b = call(1, 15, numel=64, group="1")
    from repro.collectives.analyze.align import Divergence

    d = Divergence(
        kind="mismatch",
        group="0",
        ranks=(0, 1),
        rank_a=0,
        rank_b=1,
        call_a=a,
        call_b=b,
        differing=a.differing_fields(b),
    )
    first = format_divergence(d).splitlines()[0]
    assert first.startswith("Crossed collectives") and "#1 on group 0" in first and "#15 on group 1" in first


def test_strided_notes_name_each_rank_op_site_and_parameter_once_with_a_count():
    from repro.collectives.analyze.findings import strided_notes
    from repro.collectives.events import RankTrace
    from tests.unit.collectives.helpers import call

    a, b, c = call(0, 1, op="all_gather", site="sp.py:7 f"), call(0, 2, op="all_gather", site="sp.py:7 f"), call(1, 1)
    a.strided = b.strided = ["tensor"]
    notes = strided_notes({0: RankTrace(0, [a, b]), 1: RankTrace(1, [c])})
    assert notes == ["note: rank 0's all_gather at sp.py:7 f got a non-contiguous `tensor` (2 calls): gloo takes it, "
                     'NCCL raises "Tensors must be contiguous"; pass .contiguous()']
