"""The seed's ZeRO-2 hang caught by the collective tracer on real gloo ranks: the reference actor with the
rank-local "skip inactive micro-batch" shortcut forced on (``repro.scenarios.zero2_inactive_micro``) is reported
before gloo aborts, naming the step's scalar all_reduce on one rank and the gradient reduction on the other, in
process and through the CLI; without the shortcut both ranks issue the same collectives."""

from __future__ import annotations

import time

from repro.collectives_trace import analyze
from tests.distributed.collectives.trace_cli import REPO, run_cli

_ENGINE_PY = REPO / "repro" / "workers" / "engine.py"
_SCENARIO = REPO / "repro" / "scenarios" / "zero2_inactive_micro.py"


# The phases of RoleEngine's update loop (the worker's call sites): backward per micro-batch, the
# optimizer step at the end.
_UPDATE_PHASES = ("backward_micro", "end_update")


def _engine_line(site: str) -> str:
    """The source text of ``repro/workers/engine.py:<line> <phase>``, the worker's call site."""
    path, _, rest = site.partition(":")
    assert path.endswith("repro/workers/engine.py") and rest.split()[-1] in _UPDATE_PHASES, site
    return _ENGINE_PY.read_text().splitlines()[int(rest.split()[0]) - 1]


def _tiny_qwen3_numel() -> int:
    from transformers import Qwen3ForCausalLM

    from repro.data.tiny_model import toy_qwen3_config

    model = Qwen3ForCausalLM(toy_qwen3_config())
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def _zero2_rank(rank: int, world_size: int, skip: bool, check: str, out_dir: str, model_dir: str) -> dict:
    import time as _time

    from repro.collectives.analyze.report import divergence_to_json
    from repro.collectives_trace import CollectiveMismatchError, trace_collectives
    from repro.scenarios.zero2_inactive_micro import run

    try:
        with trace_collectives(out_dir, check=check, timeout_s=20):
            out = run(rank, world_size, skip_inactive=skip, model_dir=model_dir)
    except CollectiveMismatchError as exc:
        return {
            "raised": True,
            "json": divergence_to_json(exc.divergence),
            "report": exc.report,
            "raised_at": _time.time(),  # wall clock, comparable with the calls' recorded start times
        }
    return {"raised": False, **out}


def test_zero2_actor_inactive_skip_is_caught_naming_scalar_all_reduce_and_gradient_reduction(
    pooled, tmp_path
):
    from repro.scenarios.zero2_inactive_micro import make_model_dir

    model_dir = make_model_dir(tmp_path / "model")
    results = pooled(_zero2_rank, args=(True, "every", str(tmp_path / "trace"), model_dir), timeout_s=90)
    grads = _tiny_qwen3_numel()
    for r in results:  # both ranks raise (neither is aborted by gloo)
        assert r["raised"], r
        d = r["json"]
        a, b = d["call_a"], d["call_b"]
        assert d["kind"] == "mismatch" and d["differing"] == ["numel"]
        assert (d["rank_a"], d["rank_b"]) == (0, 1) and a["group"] == b["group"]
        # Rank 0 skipped its empty micro-batch and is in the optimizer step's grad-norm all_reduce...
        assert (a["op"], a["numel"], a["dtype"]) == ("all_reduce", 1, "float32")
        assert "engine.step()" in _engine_line(a["site"])
        assert "stage_1_and_2.py" in a["lib_site"] and "get_grad_norm" in a["lib_site"]
        # ...while rank 1 is in the second micro-batch's backward, reducing every gradient element.
        assert (b["op"], b["numel"], b["dtype"]) == ("all_reduce", grads, "float32")
        assert "engine.backward(" in _engine_line(b["site"])
        assert "stage_1_and_2.py" in b["lib_site"]
        for call in (a, b):  # the side-by-side table shows both call sites
            assert call["site"] in r["report"] and call["lib_site"] in r["report"]
        # Reported within 10 s of the divergent call (rank 0's, the earlier one).
        assert 0 <= r["raised_at"] - min(a["t"], b["t"]) < 10.0
    assert "rank 0 issued all_reduce numel=1 float32" in results[0]["report"]
    assert f"rank 1 issued all_reduce numel={grads} float32" in results[0]["report"]


def test_zero2_actor_without_the_shortcut_ranks_issue_identical_collectives(pooled, tmp_path):
    from repro.collectives.events import read_trace_dir
    from repro.scenarios.zero2_inactive_micro import make_model_dir

    out = tmp_path / "trace"
    model_dir = make_model_dir(tmp_path / "model")
    results = pooled(_zero2_rank, args=(False, "every", str(out), model_dir), timeout_s=90)
    assert not any(r["raised"] for r in results)
    # Rank 0's empty micro-batch ran with a zero loss: the update is the same on both ranks.
    assert results[0]["param_checksum"] == results[1]["param_checksum"]
    assert results[0]["metrics"][0]["actor/grad_norm"] == results[1]["metrics"][0]["actor/grad_norm"]
    traces = read_trace_dir(out)
    assert sorted(traces) == [0, 1] and not any(t.check_failures for t in traces.values())
    seqs = [
        [
            (c.op, c.numel, c.dtype, traces[r].groups.get(c.group, c.ranks), c.group_seq)
            for c in traces[r].calls
        ]
        for r in (0, 1)
    ]
    assert seqs[0] == seqs[1]
    reductions = [s for s in seqs[0] if s[0] == "all_reduce"]
    # Both micro-batches' gradient reductions and the step's scalar all_reduce were recorded.
    assert sum(s[1] == _tiny_qwen3_numel() for s in reductions) == 2
    assert any(s[1] == 1 for s in reductions)
    assert analyze(out)[1] is None


def test_cli_launch_of_the_zero2_scenario_exits_nonzero_with_the_report(tmp_path):
    out = tmp_path / "trace"
    start = time.monotonic()
    done = run_cli(
        [
            "launch",
            "--nproc-per-node",
            "2",
            "--check",
            "every",
            "--out",
            str(out),
            "--",
            str(_SCENARIO),
            "--skip-inactive",
        ],
        REPO,
    )
    elapsed = time.monotonic() - start
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Collective mismatch" in done.stdout and "all_reduce numel=1 float32" in done.stdout
    assert f"all_reduce numel={_tiny_qwen3_numel()} float32" in done.stdout
    assert "get_grad_norm_direct" in done.stdout and "train_mini_batch" in done.stdout
    assert "SIGABRT" not in done.stdout
    assert elapsed < 60, elapsed
