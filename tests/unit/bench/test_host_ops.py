"""``repro.bench.host_ops``: the device-sync tally (the sync debug mode's warnings, counted by the line that issued
them)."""

from __future__ import annotations

import warnings

from repro.bench.host_ops import sync_sites

SYNC = "called a synchronizing CUDA operation"  # torch's sync debug mode's message (c10/cuda/CUDAFunctions)


def _caught(*events: tuple[str, str, int]) -> list:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for message, filename, lineno in events:
            warnings.warn_explicit(message, UserWarning, filename, lineno)
    return caught


def test_syncs_are_counted_by_issuing_line_and_other_warnings_are_not():
    caught = _caught((SYNC, "/x/lib/python3.12/site-packages/deepspeed/runtime/zero/stage_1_and_2.py", 1200),
                     (SYNC, "/tree/repro/workers/packing.py", 80),
                     (SYNC, "/x/lib/python3.12/site-packages/deepspeed/runtime/zero/stage_1_and_2.py", 1200),
                     ("some other warning", "/tree/repro/workers/actor.py", 10))
    total, sites = sync_sites(caught)
    assert total == 3
    assert sites == {"deepspeed/runtime/zero/stage_1_and_2.py:1200": 2, "/tree/repro/workers/packing.py:80": 1}
    assert list(sites) == ["deepspeed/runtime/zero/stage_1_and_2.py:1200", "/tree/repro/workers/packing.py:80"]


def test_no_sync_warning_is_zero_syncs():
    assert sync_sites(_caught(("unrelated", "/a.py", 1))) == (0, {})
