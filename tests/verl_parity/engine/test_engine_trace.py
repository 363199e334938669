"""repro's engine inside verl traces its collectives when ``REPRO_COLLECTIVES_TRACE`` is set.

This is how ``results/verl_engine/2gpu/`` checked verl's own trainer (``TRACE=... bash scripts/seed_scale.sh
verl ...``): verl creates the process group, and the engine's ``initialize`` (``init_distributed``)
installs the trace from the environment that Ray's workers inherit. Here the harness makes the gloo
group without DeepSpeed (``deepspeed=False``), as verl does, so the engine's own start-up is what
installs the trace. The clean run must record DeepSpeed's gradient reduction on both ranks with no
divergence; its twin adds one rank-local all-reduce before the step, which check mode must stop on
both ranks with both call sites.
"""

from __future__ import annotations

import pathlib

import pytest

from tests.distributed.workers.helpers import make_model_dir
from tests.verl_parity.engine import harness as h


def _one_step(rank: int, world: int, model_dir: str, extra_on_rank1: bool) -> dict:
    import torch
    import torch.distributed as dist

    from repro.collectives.record.tracer import active

    engine, loss_fn = h.new_engine(model_dir, 2, "actor")
    if extra_on_rank1 and rank == 1:
        dist.all_reduce(torch.zeros(1))  # a rank-local collective: the seed's hang in miniature
    steps = h.engine_steps(engine, loss_fn, rank, world, steps=range(1))
    return {"traced": active() is not None, "steps": steps}


def _run(tmp_path: pathlib.Path, extra_on_rank1: bool) -> tuple[pathlib.Path, list]:
    from tests.multirank import run_ranks

    trace = tmp_path / "trace"
    env = {"REPRO_COLLECTIVES_TRACE": str(trace), "REPRO_COLLECTIVES_CHECK": "every",
           # a peer that never comes is reported after this long (the default is 300 s)
           "REPRO_COLLECTIVES_TIMEOUT_S": "60"}
    out = run_ranks(_one_step, 2, tmp_path=tmp_path, timeout_s=300, deepspeed=False, env=env,
                    args=(make_model_dir(tmp_path / "model"), extra_on_rank1))
    return trace, out


def test_the_engine_installs_the_trace_from_the_environment_and_a_clean_step_has_no_divergence(tmp_path):
    from repro.collectives.analyze.findings import analyze

    trace, out = _run(tmp_path, extra_on_rank1=False)
    assert all(r["traced"] for r in out)
    traces, divergence = analyze(trace)
    assert divergence is None, divergence
    assert sorted(traces) == [0, 1]
    ops = [(c.op, c.numel) for c in traces[0].calls]
    assert ops == [(c.op, c.numel) for c in traces[1].calls]
    # DeepSpeed's ZeRO-2 gradient reduction: its 5e8-element bucket holds every gradient of the tiny
    # model, so one all-reduce carries all of them (the call the seed's rank 1 was in, at 440M elements).
    from transformers import AutoModelForCausalLM

    n_params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tmp_path / "model").parameters())
    assert ("all_reduce", n_params) in ops, (n_params, ops)


def test_a_rank_local_collective_in_the_engine_is_stopped_by_the_check_on_both_ranks(tmp_path):
    from tests.multirank import RankFailure

    with pytest.raises(RankFailure) as err:
        _run(tmp_path, extra_on_rank1=True)
    text = str(err.value)
    for rank in (0, 1):  # each rank's own traceback ends in the check's error
        assert any(line.startswith(f"[rank {rank}]") and "CollectiveMismatchError:" in line
                   for line in text.splitlines()), text[-3000:]
    assert "test_engine_trace.py" in text  # the stray call's site is named
