"""``repro.bench.gc_pauses``: Python's collections during a timed call, and the bench's ``--gc`` policy."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest

from repro.bench import gc_pauses, rmpad
from repro.bench.gc_pauses import GcPauses


@pytest.fixture
def unfrozen():
    yield
    gc.unfreeze()  # --gc freeze is process-wide: the next test meets Python's own collector again


def test_a_full_collection_inside_is_counted_as_generation_two_and_none_after_exit():
    with GcPauses() as pauses:
        gc.collect()
    assert pauses.count[2] == 1 and pauses.seconds[2] > 0 and pauses.total_seconds() >= pauses.seconds[2]
    gc.collect()
    assert pauses.count[2] == 1  # the callback left with the context


def test_freeze_moves_what_is_alive_out_of_reach_of_every_collection(unfrozen):
    kept = [[i] for i in range(1000)]  # containers the collector would scan
    gc_pauses.apply("freeze")
    assert gc.get_freeze_count() >= len(kept)
    gc_pauses.apply("default")  # Python's own: nothing to do
    assert gc.get_freeze_count() >= len(kept)


def test_a_policy_it_does_not_know_names_the_flag_and_the_choices():
    with pytest.raises(ValueError, match=r"--gc='off' is not valid; choose one of \['default', 'freeze'\]"):
        gc_pauses.apply("off")


def test_the_bench_keeps_each_timed_calls_collections_and_sets_the_policy_after_the_warm_up(unfrozen):
    frozen_at_call = []
    # Objects frozen before the bench starts are not its doing: on the GPU machine's Python 3.12 the test process
    # held 375 already (results/cpu_suite_elsewhere/README.md, session 28). The warm-up must leave that count alone.
    before = gc.get_freeze_count()

    def call() -> None:
        frozen_at_call.append(gc.get_freeze_count())
        gc.collect()

    args = SimpleNamespace(warmup=2, steps=3, gc="freeze")
    times, pauses = rmpad._timed(args, call)
    assert len(times) == 5 and len(pauses) == 3  # the warm-up's collections are not the timed calls'
    assert all(p.count[2] == 1 for p in pauses)
    assert frozen_at_call[:2] == [before, before] and all(n > before for n in frozen_at_call[2:])
    row = rmpad._gc_row("infer_", pauses)
    assert row["infer_gc_full"] == [1, 1, 1] and len(row["infer_gc_s"]) == 3
