"""Behaviour of the multi-rank harness itself: results, failures, hangs and signal deaths."""

from __future__ import annotations

import os
import pathlib
import signal
import time

import pytest

from tests.multirank import RankFailure, RankTimeout, run_ranks


def _all_reduce_rank(rank: int, world_size: int) -> dict:
    import deepspeed.comm
    import deepspeed.ops
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return {
        "rank": rank,
        "sum": t.item(),
        "dist_rank": dist.get_rank(),
        "backend": dist.get_backend(),
        "ds_comm_ready": deepspeed.comm.is_initialized(),
        "shm_op_allowed": deepspeed.ops.__compatible_ops__.get("deepspeed_shm_comm"),
        "env": {
            k: os.environ.get(k)
            for k in (
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "LOCAL_WORLD_SIZE",
                "MASTER_ADDR",
                "DS_ACCELERATOR",
                "OMP_NUM_THREADS",
                "REPRO_TEST_KNOB",
            )
        },
        # a gloo rank sees no GPU, whatever the host has; and torch agrees
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cuda_devices": torch.cuda.device_count(),
    }


def test_results_come_back_indexed_by_rank_after_a_real_all_reduce(multirank):
    start = time.monotonic()
    results = multirank(_all_reduce_rank, world_size=2, env={"REPRO_TEST_KNOB": "on"})
    elapsed = time.monotonic() - start
    print(f"2-rank all_reduce with DeepSpeed init took {elapsed:.1f} s")

    assert [r["rank"] for r in results] == [0, 1]
    assert [r["dist_rank"] for r in results] == [0, 1]
    assert [r["sum"] for r in results] == [3.0, 3.0]
    for rank, r in enumerate(results):
        assert r["backend"] == "gloo"
        assert r["ds_comm_ready"] is True
        assert r["shm_op_allowed"] is False
        assert r["env"] == {
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "DS_ACCELERATOR": "cpu",
            "OMP_NUM_THREADS": "1",
            "REPRO_TEST_KNOB": "on",
        }
        assert (r["cuda_visible_devices"], r["cuda_devices"]) == ("", 0)


def _late_knob(rank: int, world_size: int) -> str | None:
    return os.environ.get("REPRO_LATE_KNOB")


def test_ranks_see_the_test_process_environment_as_it_is_when_they_start(multirank, monkeypatch):
    # The ranks fork from a server started with the first ranks of this process: a variable set
    # after that must still reach them, as it did when every rank was spawned from the test.
    multirank(_late_knob, world_size=1, deepspeed=False)
    monkeypatch.setenv("REPRO_LATE_KNOB", "set late")
    assert multirank(_late_knob, world_size=2, deepspeed=False) == ["set late", "set late"]


def _mark_failure_time(mark_dir: str) -> None:
    """Wall-clock time of the failure, so tests time the report, not the ranks' start-up."""
    pathlib.Path(mark_dir, "failed_at").write_text(repr(time.time()))


def _seconds_since_failure(mark_dir: pathlib.Path) -> float:
    return time.time() - float((mark_dir / "failed_at").read_text())


def _raise_in_rank1_while_rank0_sleeps(rank: int, world_size: int, mark_dir: str) -> None:
    pathlib.Path(mark_dir, f"pid{rank}").write_text(str(os.getpid()))
    if rank == 1:
        # Only once rank 0 has written its pid: the test checks that this very process was killed.
        while not pathlib.Path(mark_dir, "pid0").exists():
            time.sleep(0.01)
        _mark_failure_time(mark_dir)
        raise ValueError("bad batch shape on purpose")
    time.sleep(300)


def test_raising_rank_is_reported_with_its_traceback_and_peer_is_killed(tmp_path):
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_ranks(
            _raise_in_rank1_while_rank0_sleeps, 2, tmp_path=tmp_path, args=(str(tmp_path),), deepspeed=False
        )
    latency = _seconds_since_failure(tmp_path)
    elapsed = time.monotonic() - start
    print(f"exception in rank 1 reported {latency:.2f} s after the raise ({elapsed:.1f} s with start-up)")
    message = str(info.value)
    assert not isinstance(info.value, RankTimeout)
    assert message.startswith("rank 1 exited with code 1")
    assert "[rank 1] Traceback (most recent call last):" in message
    assert "[rank 1] ValueError: bad batch shape on purpose" in message
    assert "[rank 0] --- still running when rank 1 failed; killed by the harness" in message
    peer_pid = int((tmp_path / "pid0").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(peer_pid, 0)
    # Start-up (spawn + imports) alone can take >10 s on a loaded 2-core box; bound it loosely.
    assert latency < 5
    assert elapsed < 45


def _sleep_forever_in_rank1(rank: int) -> None:
    while True:
        time.sleep(1)


def _hang_rank1_while_rank0_waits_in_barrier(rank: int, world_size: int) -> None:
    import torch.distributed as dist

    if rank == 1:
        _sleep_forever_in_rank1(rank)
    dist.barrier()


def test_hung_ranks_time_out_with_their_python_stacks(tmp_path):
    # timeout_s starts once both ranks are in their group: start-up (spawn, torch import) has its
    # own limit, so the stacks show the hang even when a loaded machine makes imports slow.
    timeout_s = 5.0
    start = time.monotonic()
    with pytest.raises(RankTimeout) as info:
        run_ranks(
            _hang_rank1_while_rank0_waits_in_barrier,
            2,
            tmp_path=tmp_path,
            timeout_s=timeout_s,
            deepspeed=False,
        )
    elapsed = time.monotonic() - start
    message = str(info.value)
    first = message.splitlines()[0]
    print(f"hang reported after {elapsed:.1f} s: {first}")
    assert first.startswith("ranks [0, 1] still running after timeout_s=5 s (start-up took ")
    startup_s = float(first.split("start-up took ")[1].split(" s)")[0])
    rank1_stack = [line for line in message.splitlines() if line.startswith("[rank 1]")]
    assert any("in _sleep_forever_in_rank1" in line for line in rank1_stack), message
    rank0_stack = [line for line in message.splitlines() if line.startswith("[rank 0]")]
    assert any("in barrier" in line for line in rank0_stack), message
    assert startup_s + timeout_s <= elapsed < startup_s + timeout_s + 8


def _kill_rank1_by_signal(rank: int, world_size: int, signame: str, mark_dir: str) -> None:
    import torch.distributed as dist

    if rank == 1:
        print("rank 1 about to die", flush=True)
        _mark_failure_time(mark_dir)
        os.kill(os.getpid(), signal.Signals[signame])
        time.sleep(60)  # SIGKILL/SIGABRT are not delivered late, but never fall through to the barrier
    dist.barrier()


@pytest.mark.parametrize("signame", ["SIGKILL", "SIGABRT"])
def test_rank_killed_by_signal_is_reported_with_the_signal_name(tmp_path, signame):
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_ranks(_kill_rank1_by_signal, 2, tmp_path=tmp_path, args=(signame, str(tmp_path)), deepspeed=False)
    latency = _seconds_since_failure(tmp_path)
    elapsed = time.monotonic() - start
    print(f"{signame} of rank 1 reported {latency:.2f} s after the kill ({elapsed:.1f} s with start-up)")
    message = str(info.value)
    assert message.startswith(f"rank 1 killed by signal {signame}"), message
    assert "[rank 1] rank 1 about to die" in message
    if signame == "SIGABRT":
        # faulthandler prints the dying rank's stack into its log
        assert any(
            line.startswith("[rank 1]") and "in _kill_rank1_by_signal" in line
            for line in message.splitlines()
        ), message
    assert latency < 5
    assert elapsed < 45


def test_local_functions_are_rejected_before_spawning(tmp_path):
    def local_fn(rank: int, world_size: int) -> None:
        return None

    with pytest.raises(ValueError, match="module-level"):
        run_ranks(local_fn, 2, tmp_path=tmp_path)
    assert not list(tmp_path.iterdir())


def test_an_unknown_backend_is_rejected_naming_the_valid_ones_before_spawning(tmp_path):
    with pytest.raises(ValueError, match=r"backend='mpi' is not supported; choose one of \['gloo', 'nccl'\]"):
        run_ranks(_all_reduce_rank, 2, tmp_path=tmp_path, backend="mpi")
    assert not list(tmp_path.iterdir())


def test_tests_under_distributed_carry_the_distributed_marker(request):
    assert request.node.get_closest_marker("distributed") is not None
