"""``repro.bench.host_ops``: the operators' issuers, and the device-sync tally (the sync debug mode's warnings,
counted by the line that issued them)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from repro.bench.host_ops import NO_FRAME, host_ops, is_python_frame, profiler_gives_python_frames, sync_sites

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


def _update():
    x = torch.ones(4)
    with torch.profiler.record_function("repro::optimizer"):  # a phase range, as repro's optimizer step has
        x.mul_(2)
    x.add_(1)


def test_ops_without_a_python_frame_are_counted_as_such_under_a_phase_range_too():
    # the GPU machine's profiler recorded no Python frame (results/cpu_suite_elsewhere/README.md, session 26); a
    # record_function range above an op is not one, so the op is no frame's, not torch's own ``other``
    counted = host_ops(_update, with_stack=False)
    assert counted["host_ops_by"] == {NO_FRAME: counted["host_ops"]} and counted["host_ops"] >= 3, counted


def test_with_python_frames_the_ops_are_this_test_modules():
    # probed here, not in a skipif: the probe starts torch's profiler (1.8 s the first time), which at collection
    # every xdist worker would pay
    if not profiler_gives_python_frames():
        pytest.skip("this torch's profiler records no Python frame (the GPU machine's torch 2.11 on Python 3.12; the "
                    "test above covers that case)")
    counted = host_ops(_update)
    assert NO_FRAME not in counted["host_ops_by"] and counted["host_ops"] >= 3, counted


def test_only_python_frames_are_frames_whatever_the_range_flags_say():
    # the GPU machine's torch 2.11 counted 64 ops of one tiny update as ``other``: ranges and autograd nodes above them
    # (``Optimizer.step#AdamW.step``, ``AddmmBackward0``), on a torch with no is_python_function flag (session 27)
    def event(name: str = "x", **flags):
        return SimpleNamespace(name=name, **flags)

    assert is_python_frame(event(is_python_function=True, is_user_annotation=False))
    assert not is_python_frame(event(is_python_function=False, is_user_annotation=False))
    assert not is_python_frame(event(is_python_function=False, is_user_annotation=True))
    # torch 2.11: no is_python_function; a frame by its tracer's name, nothing else
    assert is_python_frame(event("repro/workers/actor.py(212): update_policy", is_user_annotation=False))
    assert is_python_frame(event("<built-in method mul of Tensor object at 0x7f>", is_user_annotation=False))
    for name in ("AddmmBackward0", "torch::autograd::AccumulateGrad", "Optimizer.step#AdamW.step", "repro::optimizer"):
        assert not is_python_frame(event(name, is_user_annotation=False)), name
