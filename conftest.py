"""Repository-wide pytest set-up: hypothesis profiles and the GPU gate's skip-or-fail rule."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=30, deadline=None)
settings.register_profile(
    "ci",
    max_examples=60,
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

# Keep DeepSpeed on its CPU accelerator unless a GPU run asks otherwise.
if not os.environ.get("REPRO_GPU_TESTS"):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # Nothing on the CPU suites uses torch.compile, yet every ZeRO engine imports DeepSpeed's Muon
    # module (its optimizer type check), whose @torch.compile decorators import torch._inductor:
    # about 1.4 s per rank process. torch's own switch makes those decorators no-ops. Every rank,
    # Ray worker and job the suites start inherits it.
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")


def require_cuda_gpus(n: int) -> None:
    """Skip (or fail under ``REPRO_REQUIRE_GPU=1``) unless ``n`` CUDA GPUs are visible."""
    import torch

    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found >= n:
        return
    reason = f"needs {n} CUDA GPU{'s' if n != 1 else ''}, found {found}"
    if os.environ.get("REPRO_REQUIRE_GPU") == "1":
        pytest.fail(reason + " (REPRO_REQUIRE_GPU=1)")
    pytest.skip(reason)
