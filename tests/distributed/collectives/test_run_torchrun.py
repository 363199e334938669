"""``run`` under plain torchrun (no ``launch``): a rank dumps its Flight Recorder on a stall, on SIGTERM."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap
import time

from repro.collectives_trace import analyze
from tests.subprocess_env import pythonpath

_REPO = pathlib.Path(__file__).resolve().parents[3]

# Rank 0 issues one all_reduce more than rank 1, which then waits outside torch.distributed.
_EXTRA = """
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for _ in range(3):
    dist.all_reduce(torch.ones(4))
if dist.get_rank() == 0:
    dist.all_reduce(torch.ones(4))  # line 10: rank 0's extra call
else:
    time.sleep(600)
"""


def _wait_for(path: pathlib.Path, proc: subprocess.Popen, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and proc.poll() is None:
        if path.exists():
            return True
        time.sleep(0.2)
    return path.exists()


def _end(proc: subprocess.Popen, out: pathlib.Path) -> None:
    """Leave nothing running: torchrun starts each worker in a session of its own."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for record in out.glob("rank*.jsonl"):
        try:
            os.kill(json.loads(record.read_text().splitlines()[0])["pid"], signal.SIGKILL)
        except (ProcessLookupError, ValueError, KeyError, IndexError):
            pass


def test_ranks_started_by_torchrun_dump_the_flight_recorder_on_a_stall_and_on_sigterm(tmp_path):
    script = tmp_path / "extra.py"
    script.write_text(textwrap.dedent(_EXTRA))
    out = tmp_path / "trace"
    env = dict(
        os.environ,
        PYTHONPATH=pythonpath(_REPO),
        REPRO_COLLECTIVES_TRACE=str(out),
        REPRO_COLLECTIVES_STALL_S="2",
    )
    env.pop("TORCH_FR_BUFFER_SIZE", None)  # ``run`` arms the recorder itself
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "repro.collectives_trace", "run", str(script)]
    with open(tmp_path / "torchrun.log", "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        # rank 0 is stuck in its extra all_reduce: its own watch dumps, while the job still runs
        assert _wait_for(out / "fr_trace_rank_0", proc, 60), (tmp_path / "torchrun.log").read_text()[-3000:]
        assert (
            proc.poll() is None and not (out / "fr_trace_rank_1").exists()
        )  # rank 1 has nothing outstanding
        os.kill(proc.pid, signal.SIGTERM)  # as a scheduler or Ctrl-C ends the job: torchrun passes it on
        proc.wait(timeout=60)
    finally:
        _end(proc, out)
    assert (out / "fr_trace_rank_1").exists(), (tmp_path / "torchrun.log").read_text()[-3000:]
    # The dumps alone tell the divergence, with the user's lines, as launch's do.
    dumps = tmp_path / "fr_only"
    dumps.mkdir()
    for rank in (0, 1):
        shutil.copy(out / f"fr_trace_rank_{rank}", dumps)
    traces, d = analyze(dumps)
    assert traces[0].meta.get("format") == "flight_recorder"
    assert [len(traces[r].calls) for r in (0, 1)] == [4, 3]
    assert d is not None and d.kind == "stopped" and (d.rank_a, d.rank_b) == (0, 1)
    assert d.call_a.op == "all_reduce" and d.call_a.site.endswith("extra.py:10 <module>"), d.call_a.site
