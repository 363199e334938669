"""``run.lock``: one live run per folder; a stale lock is taken over, another host's never."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from repro.run.lock import LOCK_FILE, RunLocked, acquire, read_holder
from tests.subprocess_env import pythonpath

ROOT = Path(__file__).resolve().parents[3]


def _holder_process(run_dir: Path) -> subprocess.Popen:
    """A real second process that takes the lock and keeps it until its stdin closes."""
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from repro.run.lock import acquire
        with acquire(Path({str(run_dir)!r})):
            print("held", flush=True)
            sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": pythonpath(ROOT)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_lock_file_names_pid_host_and_start_time_and_is_released(tmp_path):
    with acquire(tmp_path) as lock:
        data = json.loads((tmp_path / LOCK_FILE).read_text())
        assert data["host"] == socket.gethostname() and data["pid"] == lock.holder.pid
        assert time.strptime(data["started"], "%Y-%m-%dT%H:%M:%SZ")
    assert not (tmp_path / LOCK_FILE).exists()
    assert [p.name for p in tmp_path.iterdir()] == []


def test_second_launch_is_refused_naming_the_live_holder(tmp_path):
    proc = _holder_process(tmp_path)
    try:
        holder = read_holder(tmp_path / LOCK_FILE)
        with pytest.raises(RunLocked, match=f"pid {proc.pid} on host {socket.gethostname()}"):
            acquire(tmp_path)
        assert read_holder(tmp_path / LOCK_FILE) == holder, "a refused launch must leave the lock alone"
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert not (tmp_path / LOCK_FILE).exists()
    acquire(tmp_path).release()


def test_stale_lock_of_a_dead_process_is_taken_over_and_reported(tmp_path):
    pid = _dead_pid()
    (tmp_path / LOCK_FILE).write_text(json.dumps(
        {"pid": pid, "host": socket.gethostname(), "started": "2026-01-01T00:00:00Z", "token": "old"}))
    lock = acquire(tmp_path)
    assert lock.took_over is not None and lock.took_over.pid == pid
    assert read_holder(tmp_path / LOCK_FILE).token == lock.holder.token
    lock.release()


def test_another_hosts_lock_is_never_taken(tmp_path):
    pid = _dead_pid()  # dead here, but it names another machine's process
    (tmp_path / LOCK_FILE).write_text(json.dumps(
        {"pid": pid, "host": "node-b", "started": "2026-01-01T00:00:00Z", "token": "theirs"}))
    with pytest.raises(RunLocked, match="node-b.*never taken"):
        acquire(tmp_path)
    assert read_holder(tmp_path / LOCK_FILE).token == "theirs"


def test_release_leaves_a_lock_that_is_no_longer_ours(tmp_path):
    lock = acquire(tmp_path)
    (tmp_path / LOCK_FILE).unlink()
    other = acquire(tmp_path)
    lock.release()
    assert read_holder(tmp_path / LOCK_FILE) == other.holder
    other.release()


def test_second_launch_of_main_ppo_exits_2_before_anything_starts(tmp_path, monkeypatch, capsys):
    from repro.main_ppo import main

    out = tmp_path / "run"
    proc = _holder_process(out)
    try:
        code = main(["-cn", "grpo_tiny", "trainer.device=cpu", f"trainer.output_dir={out}"])
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    err = capsys.readouterr().err
    assert code == 2 and f"pid {proc.pid}" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == [], "the refused launch wrote into the live run's folder"
