"""Behaviour of the warm rank pool: results, failure and hang reports, isolation between tasks."""

from __future__ import annotations

import gc
import os
import time
import weakref

import pytest

from tests.multirank import RankFailure, RankTimeout
from tests.rank_pool import RankPool

# Set by one task and read by the next in the same (warm) rank process: what a leak would show.
_SEEN: dict[str, object] = {}


def _all_reduce_rank(rank: int, world_size: int) -> dict:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return {"sum": t.item(), "rank": dist.get_rank(), "world": dist.get_world_size(), "pid": os.getpid(),
            "knob": os.environ.get("REPRO_TEST_KNOB"), "env_rank": os.environ["RANK"]}


def test_tasks_run_on_the_same_warm_ranks_with_their_own_world_size(tmp_path):
    with RankPool(size=2) as pool:
        first = pool.run(_all_reduce_rank, 2, tmp_path=tmp_path, env={"REPRO_TEST_KNOB": "on"})
        start = time.monotonic()
        second = pool.run(_all_reduce_rank, 2, tmp_path=tmp_path)
        warm_s = time.monotonic() - start
        (alone,) = pool.run(_all_reduce_rank, 1, tmp_path=tmp_path)
        assert pool.spawns == 1 and pool.tasks_run == 3
    print(f"a warm 2-rank all_reduce task with DeepSpeed init took {warm_s:.2f} s")
    assert [r["sum"] for r in first] == [3.0, 3.0] == [r["sum"] for r in second]
    assert [r["rank"] for r in second] == [0, 1] and [r["env_rank"] for r in second] == ["0", "1"]
    assert [r["pid"] for r in first] == [r["pid"] for r in second]
    assert [r["knob"] for r in first] == ["on", "on"] and [r["knob"] for r in second] == [None, None]
    assert alone == {**first[0], "sum": 1.0, "world": 1, "knob": None}


def _raise_in_rank1(rank: int, world_size: int) -> None:
    import torch.distributed as dist

    if rank == 1:
        raise RuntimeError("rank one broke on purpose")
    dist.barrier()  # rank 0 waits in a collective that never completes


def _sleep_in_rank0(rank: int, world_size: int) -> None:
    if rank == 0:
        time.sleep(600)


def test_a_rank_exception_is_reported_with_its_traceback_and_the_pool_recovers(rank_pool, tmp_path):
    with pytest.raises(RankFailure) as info:
        rank_pool.run(_raise_in_rank1, 2, tmp_path=tmp_path, timeout_s=60)
    text = str(info.value)
    assert text.startswith("rank 1 raised"), text[:300]
    assert "[rank 1] RuntimeError: rank one broke on purpose" in text
    assert "_raise_in_rank1" in text
    assert [r["sum"] for r in rank_pool.run(_all_reduce_rank, 2, tmp_path=tmp_path)] == [3.0, 3.0]


def test_a_hang_becomes_a_timeout_naming_the_rank_with_its_stack(rank_pool, tmp_path):
    start = time.monotonic()
    with pytest.raises(RankTimeout) as info:
        rank_pool.run(_sleep_in_rank0, 2, tmp_path=tmp_path, timeout_s=5)
    assert time.monotonic() - start < 20
    text = str(info.value)
    # rank 1 finished fn and waits in the harness rendezvous for rank 0, as under run_ranks
    assert text.startswith("ranks [0, 1] still running after timeout_s=5 s"), text[:300]
    assert "[rank 0] --- Python stack at timeout:" in text
    assert "_sleep_in_rank0" in text
    assert [r["sum"] for r in rank_pool.run(_all_reduce_rank, 2, tmp_path=tmp_path)] == [3.0, 3.0]


def _leave_state_behind(rank: int, world_size: int, model_dir: str) -> dict:
    import deepspeed.comm.comm as ds_comm
    import deepspeed.utils.groups as groups
    import torch
    import torch.distributed as dist
    from deepspeed.runtime.sequence_parallel import parallel_state_sp
    from deepspeed.sequence.layer import _all_to_all_groups, register_all_to_all_group

    from repro.workers.actor import ActorWorker
    from tests.distributed.workers.helpers import make_cfg

    worker = ActorWorker(make_cfg(model_dir, world=world_size, stage=2))
    groups._get_data_parallel_group()  # registers DeepSpeed's world group
    parallel_state_sp.initialize_sequence_parallel(sequence_parallel_size=2)  # what Ulysses sets up
    register_all_to_all_group(parallel_state_sp.get_sequence_parallel_group())
    assert _all_to_all_groups
    os.environ["REPRO_LEAKED_KNOB"] = "1"
    torch.set_default_dtype(torch.float64)
    dist.distributed_c10d._get_default_store().set("left_by_the_first_task", "1")
    _SEEN.update(engine=weakref.ref(worker.engine), cdb=weakref.ref(ds_comm.cdb))
    return {"pid": os.getpid(), "world_group_set": groups._WORLD_GROUP is not None,
            "sp_group_set": parallel_state_sp._SEQUENCE_PARALLEL_GROUP is not None}


def _inspect_state(rank: int, world_size: int) -> dict:
    import deepspeed.comm.comm as ds_comm
    import deepspeed.utils.groups as groups
    import torch
    import torch.distributed as dist
    from deepspeed.runtime.sequence_parallel import parallel_state_sp
    from deepspeed.sequence.layer import _all_to_all_groups

    gc.collect()
    return {
        "sp_group_set": parallel_state_sp._SEQUENCE_PARALLEL_GROUP is not None or bool(_all_to_all_groups),
        "pid": os.getpid(),
        "engine_alive": _SEEN["engine"]() is not None,
        "same_store": dist.distributed_c10d._get_default_store().check(["left_by_the_first_task"]),
        "same_ds_backend": _SEEN["cdb"]() is ds_comm.cdb,
        "world_group_set": groups._WORLD_GROUP is not None,
        "knob": os.environ.get("REPRO_LEAKED_KNOB"),
        "dtype": str(torch.get_default_dtype()),
    }


def test_consecutive_tasks_share_no_engine_group_environment_or_dtype(rank_pool, tmp_path):
    from tests.distributed.workers.helpers import make_model_dir

    model_dir = make_model_dir(tmp_path / "model")
    before = rank_pool.run(_leave_state_behind, 2, tmp_path=tmp_path, timeout_s=90, args=(model_dir,))
    after = rank_pool.run(_inspect_state, 2, tmp_path=tmp_path)
    assert [(b["world_group_set"], b["sp_group_set"]) for b in before] == [(True, True), (True, True)]
    for b, a in zip(before, after, strict=True):
        assert a == {"pid": b["pid"], "sp_group_set": False, "engine_alive": False, "same_store": False, "same_ds_backend": False,
                     "world_group_set": False, "knob": None, "dtype": "torch.float32"}


def _zero3_worker(rank: int, world_size: int, model_dir: str) -> None:
    from repro.workers.actor import ActorWorker
    from tests.distributed.workers.helpers import ZERO3_PARTITION_ALL, make_cfg

    ActorWorker(make_cfg(model_dir, world=world_size, stage=3), ds_overrides=ZERO3_PARTITION_ALL)


def _zero3_counters(rank: int, world_size: int) -> dict:
    from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload
    from deepspeed.runtime.zero.partition_parameters import Init

    return {"param_id": Init.param_id, "module_count": DeepSpeedZeRoOffload._register_deepspeed_module.__defaults__[0]}


def test_a_one_rank_zero3_task_leaves_no_counter_that_desynchronises_the_next(rank_pool, tmp_path):
    # ZeRO-3 numbers parameters and modules with process-wide counters and checks that ranks agree;
    # a 1-rank task runs on rank 0 alone, so a counter it advanced would differ between ranks.
    from tests.distributed.workers.helpers import make_model_dir

    model_dir = make_model_dir(tmp_path / "model")
    start = rank_pool.run(_zero3_counters, 2, tmp_path=tmp_path)
    rank_pool.run(_zero3_worker, 1, tmp_path=tmp_path, timeout_s=90, args=(model_dir,))
    assert rank_pool.run(_zero3_counters, 2, tmp_path=tmp_path) == start
    rank_pool.run(_zero3_worker, 2, tmp_path=tmp_path, timeout_s=90, args=(model_dir,))
