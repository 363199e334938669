"""Rank processes kept between runs (``REPRO_REUSE_RANKS=1``, ``repro.cluster.worker_group``): the next run gets
the same processes in a clean state; a run that failed on them, or that still holds them, never
hands its processes on."""

from __future__ import annotations

import os

import pytest
import torch

from repro.config import RunConfig
from tests.distributed.cluster.probes import RankProbe


class StateProbe(RankProbe):
    """Reports what a previous run could have left behind, and leaves such state behind."""

    def state(self) -> dict:
        from deepspeed.runtime.sequence_parallel import parallel_state_sp

        return {"pid": os.getpid(), "tag": self.tag, "rank": os.environ["RANK"],
                "leak": os.environ.get("REPRO_TEST_LEFT_BEHIND"), "dtype": str(torch.get_default_dtype()),
                "sp_group": parallel_state_sp._SEQUENCE_PARALLEL_GROUP is not None,
                "world": torch.distributed.get_world_size()}

    def leave_state(self) -> None:
        from deepspeed.runtime.sequence_parallel import parallel_state_sp

        os.environ["REPRO_TEST_LEFT_BEHIND"] = "1"
        torch.set_default_dtype(torch.float64)
        parallel_state_sp.initialize_sequence_parallel(sequence_parallel_size=2)


def _group(address: str, tag: str):
    from repro.cluster.worker_group import WorkerGroup

    cfg = RunConfig()
    cfg.trainer.n_gpus_per_node, cfg.trainer.device, cfg.trainer.ray_address = 2, "cpu", address
    return WorkerGroup(cfg, StateProbe, tag)


def test_reused_ranks_start_clean_and_a_failed_or_held_run_does_not_hand_them_on(ray_head, monkeypatch):
    from repro.cluster.errors import WorkerError
    from repro.cluster.worker_group import shutdown_ray

    monkeypatch.setenv("REPRO_REUSE_RANKS", "1")
    try:
        first = _group(ray_head, "first")
        assert first.reuse
        before = first.execute_all_same("state")
        first.execute_all_same("leave_state")
        first.shutdown()

        second = _group(ray_head, "second")
        after = second.execute_all_same("state")
        assert [a["pid"] for a in after] == [b["pid"] for b in before], "the same processes host the next run"
        for rank, a in enumerate(after):
            assert a == {"pid": a["pid"], "tag": "second", "rank": str(rank), "leak": None,
                         "dtype": "torch.float32", "sp_group": False, "world": 2}
        assert second.execute_all("all_reduce", [1.0, 10.0]) == [11.0, 11.0], "a new process group"

        with pytest.raises(WorkerError):
            second.execute_all_same("fail_on", 1)
        second.shutdown()
        third = _group(ray_head, "third")
        assert third.reuse, "new kept processes replace the killed ones"
        pids = {s["pid"] for s in third.execute_all_same("state")}
        assert pids.isdisjoint(a["pid"] for a in after), "a run that failed on its ranks has them killed"

        # Still held by a run (as after kill -9 of its driver): the next run starts ranks of its own.
        fourth = _group(ray_head, "fourth")
        assert not fourth.reuse
        assert {s["pid"] for s in fourth.execute_all_same("state")}.isdisjoint(pids)
        assert third.execute_all("all_reduce", [2.0, 3.0]) == [5.0, 5.0], "the holding run is left alone"
        fourth.shutdown()
        third.shutdown()
    finally:
        shutdown_ray()
