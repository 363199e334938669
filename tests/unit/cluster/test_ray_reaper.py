"""The reaper ends only processes holding files of a repro Ray session whose driver is gone."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil

from repro.cluster import ray_reaper


def _holder(path) -> subprocess.Popen:
    """A process keeping ``path`` open, as Ray's agents keep their session's log files."""
    return subprocess.Popen([sys.executable, "-c", f"f = open({str(path)!r}, 'a'); import time; time.sleep(60)"])


def _session(tmp_path, name: str, owner: dict | None):
    logs = tmp_path / name / "logs"
    logs.mkdir(parents=True)
    if owner is not None:
        (tmp_path / name / ray_reaper.OWNER_FILE).write_text(json.dumps(owner))
    return logs / "dashboard_agent.log"


def _wait_open(proc: subprocess.Popen, path) -> None:
    deadline = time.time() + 20
    while str(path) not in {f.path for f in psutil.Process(proc.pid).open_files()}:
        assert time.time() < deadline, "the holder never opened its file"
        time.sleep(0.05)


def test_only_the_orphans_of_a_dead_owner_are_ended(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead_owner = {"pid": gone.pid, "started": 0.0}
    me = psutil.Process()
    live_owner = {"pid": me.pid, "started": round(me.create_time(), 2)}
    files = {"orphan": _session(tmp_path, "session_1_dead", dead_owner),
             "live": _session(tmp_path, "session_2_live", live_owner),
             "foreign": _session(tmp_path, "session_3_not_repro", None)}
    procs = {k: _holder(f) for k, f in files.items()}
    try:
        for k, p in procs.items():
            _wait_open(p, files[k])
        ended = ray_reaper.reap_orphans()
        assert [line.split()[0] for line in ended] == [str(procs["orphan"].pid)]
        assert procs["orphan"].wait(timeout=10) is not None
        assert procs["live"].poll() is None and procs["foreign"].poll() is None
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def test_mark_session_names_this_process(tmp_path):
    ray_reaper.mark_session(tmp_path)
    owner = json.loads((tmp_path / ray_reaper.OWNER_FILE).read_text())
    assert ray_reaper._owner_alive(owner)
    assert not ray_reaper._owner_alive({**owner, "started": owner["started"] - 5})  # the pid, reused
