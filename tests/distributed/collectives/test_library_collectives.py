"""Collectives a library issues from C++ (DDP's reducer): checked like the user's own, hangs reported.

The twin programs of ``tests/collectives_programs`` run under the real launcher on 2 gloo ranks;
each divergent run has a clean twin that must run clean, so the finding can fail.
"""

from __future__ import annotations

import json
import pathlib
import re
import time

from tests.distributed.collectives.trace_cli import run_cli

PROGRAMS = pathlib.Path(__file__).resolve().parents[2] / "collectives_programs"


def _run(program: str, twin: str, out: pathlib.Path, check: str, stall_s: str = "5"):
    args = ["launch", "--nproc-per-node", "2", "--check", check, "--timeout-s", "60", "--stall-s", stall_s]
    args += ["--grace-s", "3", "--out", str(out), "--", str(PROGRAMS / f"{program}.py"), twin]
    done = run_cli(args, PROGRAMS)
    return done, time.time()


def _last_record_t(out: pathlib.Path) -> float:
    """When any rank last wrote a record (a call, a return): the hang watch counts from there."""
    latest = 0.0
    for path in out.glob("rank*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                latest = max(latest, float(json.loads(line).get("t") or 0.0))
            except (json.JSONDecodeError, TypeError, ValueError):
                continue
    return latest


def test_a_ddp_rank_alone_with_find_unused_parameters_is_caught_in_check_mode_and_the_setting_named(tmp_path):
    done, _ = _run("ddp_unused", "divergent", tmp_path / "div", "every")
    text = done.stdout + done.stderr
    assert done.returncode == 1, text
    assert "found by: check (every)" in text
    assert "rank 1 issued all_reduce numel=4 int32" in text  # one int per parameter: the bitmap
    assert "Cause: the ranks built DistributedDataParallel with different settings" in text
    assert "find_unused_parameters=False on rank 0, find_unused_parameters=True on rank 1" in text
    assert "ddp_unused.py:16 <module>" in text  # rank 1's loss.backward()
    clean, _ = _run("ddp_unused", "clean", tmp_path / "clean", "every")
    assert clean.returncode == 0 and "no divergence" in clean.stdout, clean.stdout + clean.stderr


def test_the_ddp_find_unused_parameters_hang_is_reported_within_the_stall_limit_in_record_mode(tmp_path):
    out = tmp_path / "rec"
    done, finished = _run("ddp_unused", "divergent", out, "off", stall_s="5")
    text = done.stdout + done.stderr
    assert done.returncode == 1, text
    assert "no rank made progress for" in text and "the job hangs" in text
    assert "find_unused_parameters=True on rank 1" in text
    # stall limit + the 1.5 s stack dump + teardown on a loaded 2-core machine
    assert finished - _last_record_t(out) < 5 + 25, text


def test_an_extra_forward_through_a_helper_on_one_fsdp2_rank_is_named_as_the_cause(tmp_path):
    done, _ = _run("fsdp2_helper", "divergent", tmp_path / "div", "every")
    text = done.stdout + done.stderr
    assert done.returncode == 1, text
    # (the script's path as given to the launcher: absolute here, so its package path is printed)
    assert re.search(
        r"Cause: rank 0 ran an extra pass that rank 1 did not: the call at \S*fsdp2_helper\.py:30 <module> "
        r"\(into gradient_probe\)",
        text,
    ), text
    clean, _ = _run("fsdp2_helper", "clean", tmp_path / "clean", "every")
    assert clean.returncode == 0 and "no divergence" in clean.stdout, clean.stdout + clean.stderr
