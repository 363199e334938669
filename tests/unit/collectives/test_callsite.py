"""Call-site selection: the first frame outside torch, DeepSpeed and the tracer; library site kept."""

from __future__ import annotations

import os

import deepspeed
import torch

from repro.collectives.callsite import current_sites, sites_from_frames

TORCH = os.path.dirname(torch.__file__)
DS = os.path.dirname(deepspeed.__file__)


def test_user_frame_after_deepspeed_internals_is_the_site_and_innermost_deepspeed_frame_the_library_site():
    frames = [
        (f"{TORCH}/distributed/distributed_c10d.py", 3245, "all_reduce"),
        (f"{TORCH}/distributed/c10d_logger.py", 83, "wrapper"),
        (f"{DS}/comm/torch.py", 290, "all_reduce"),
        (f"{DS}/comm/comm.py", 120, "all_reduce"),
        (f"{DS}/runtime/zero/stage_1_and_2.py", 2384, "allreduce_bucket"),
        (f"{DS}/runtime/engine.py", 2500, "backward"),
        (f"{TORCH}/autograd/__init__.py", 300, "backward"),
        ("/work/main/repro/workers/actor.py", 77, "update_policy"),
        ("/work/main/tests/test_x.py", 5, "test_y"),
    ]
    site, lib = sites_from_frames(frames)
    assert site.endswith("repro/workers/actor.py:77 update_policy")
    assert lib == "deepspeed/runtime/zero/stage_1_and_2.py:2384 allreduce_bucket"


def test_frames_in_tests_and_scripts_count_as_user_code():
    def inner():
        return current_sites(skip=0)

    site, lib = inner()
    assert "test_callsite.py" in site and site.endswith("inner") and lib is None
