"""What the host dispatches in one more update, counted by torch.profiler: the work of a launch-bound GPU step.

``python -m repro.bench.rmpad --host-ops`` reports it for each case (``results/actor_update/README.md``, session 12
on): the number depends on the model's depth and the batch split, not on its width, so a CPU counts a GPU's.
"""

from __future__ import annotations

import re

from repro.devices import on_cpu

_OWNERS = (("deepspeed/", "deepspeed"), ("repro/", "repro"), ("transformers/", "transformers"))
NO_FRAME = "no Python frame"
"""The issuer of an op for which torch's profiler recorded no Python frame (``with_stack``)."""


def host_ops(update, with_stack: bool = True) -> dict:
    """What the host dispatches in one more call of ``update`` (one optimizer update), counted by torch.profiler's
    CPU activity: the same on any machine for a given model depth and batch split, and the work of a launch-bound
    GPU step.

    ``host_ops``: operators (``aten::``, and the autograd engine's backward nodes) inside no other
    operator, on any thread: each a dispatch and, on a GPU, one or more kernel launches.
    ``host_ops_by``: the same by who issued them (the innermost package frame on the op's Python
    stack; ``autograd`` for the backward nodes, ``other`` for torch itself, :data:`NO_FRAME` where the
    profiler gave the op no Python stack); ``host_ops_top``: the
    twelve frames that issued most. ``host_syncs`` (CUDA only, one more update): the operations
    torch's sync debug mode flags as waiting for the GPU to drain (``item()``, ``nonzero``,
    device-to-host copies...); not counted on a CPU, where every tensor is a host tensor and such
    reads cost nothing. ``host_sync_sites``: those syncs by the Python line that issued them (:func:`sync_sites`).
    ``with_stack=False`` records no Python frame, as the GPU machine's profiler did with it on: how its tests meet
    that case on any machine.
    """
    from collections import Counter

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], with_stack=with_stack) as prof:
        update()

    def is_op(e) -> bool:
        return e.name.startswith(("aten::", "autograd::"))

    by: Counter[str] = Counter()
    frames_by: Counter[str] = Counter()
    events = prof.events()
    for e in events:
        if not is_op(e):
            continue
        frames, parent = [], e.cpu_parent
        while parent is not None and not is_op(parent):
            if is_python_frame(parent):  # innermost first
                frames.append(parent.name)
            parent = parent.cpu_parent
        if parent is not None:
            continue  # inside another operator: part of its dispatch
        # torch 2.13 on Python 3.11 makes the Python frames the op's parents; the GPU machine's torch 2.11 on
        # Python 3.12 records none for any op, nor in the op's own ``stack`` (results/actor_update/README.md,
        # session 13; which of the two versions it is, not known): such ops are counted as such, not as torch's own
        frame = "autograd" if e.name.startswith("autograd::engine") else next(
            (f for f in frames if any(key in f for key, _ in _OWNERS)), "other" if frames else NO_FRAME)
        by[next((name for key, name in _OWNERS if key in frame), frame)] += 1
        frames_by[frame.split("packages/")[-1]] += 1
    syncs, sites = _device_syncs(update)
    return {"host_ops": sum(by.values()), "host_ops_by": dict(by.most_common()),
            "host_ops_top": dict(frames_by.most_common(12)), "host_syncs": syncs, "host_sync_sites": sites}


def is_python_frame(event) -> bool:
    """Whether a profiler event above an op is a Python frame (``with_stack``), not a range such as repro's phases
    (``record_function``), torch's ``Optimizer.step#AdamW.step`` or an autograd node (``AddmmBackward0``). torch 2.13
    flags frames (``is_python_function``); the GPU machine's torch 2.11 has no such flag and records no Python frame,
    and there the ops under its ranges and nodes were counted as torch's ``other`` (sessions 26 and 27). Without the
    flag, a frame is known by the name torch's Python tracer gives it: ``file(line): function`` or ``<built-in ...>``."""
    flag = getattr(event, "is_python_function", None)
    if flag is not None:
        return bool(flag)
    return _FRAME_NAME.search(event.name) is not None


_FRAME_NAME = re.compile(r"\(\d+\): |^<built-in ")


def sync_sites(caught: list) -> tuple[int, dict[str, int]]:
    """The sync debug mode's warnings: how many, and by the Python line that issued each (the warning's
    own file and line: torch attributes it to the frame that called the synchronising operator)."""
    from collections import Counter

    sites = Counter(f"{w.filename.split('packages/')[-1]}:{w.lineno}" for w in caught if "synchroniz" in str(w.message))
    return sum(sites.values()), dict(sites.most_common(12))


def _device_syncs(update) -> tuple[int | str, dict[str, int]]:
    import warnings

    import torch

    if on_cpu():
        return "", {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            update()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sync_sites(caught)


def profiler_gives_python_frames() -> bool:
    """Whether this torch's profiler (``with_stack``) puts a Python frame above an op called from Python: torch 2.13 on
    Python 3.11 does; the GPU machine's torch 2.11 on Python 3.12 did not (``results/cpu_suite_elsewhere/README.md``,
    sessions 26-27), so there every op's issuer is :data:`NO_FRAME`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def caller_frame_marker() -> torch.Tensor:
        return torch.ones(3) * 2

    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        caller_frame_marker()
    for e in prof.events():
        if e.name == "aten::mul":
            frames, parent = [], e.cpu_parent
            while parent is not None:
                frames.append(parent.name)
                parent = parent.cpu_parent
            return any("caller_frame_marker" in f for f in frames)
    raise AssertionError("the probe's multiplication was not profiled")
