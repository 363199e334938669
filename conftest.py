"""Repository-wide pytest set-up: hypothesis profiles and the GPU gate's skip-or-fail rule."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=30, deadline=None)
# ci: the same examples on every machine and every run. derandomize seeds each test from its own
# source; database=None keeps a local example database (.hypothesis/) from replaying examples that
# another checkout never saw.
settings.register_profile(
    "ci",
    max_examples=60,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
settings.load_profile(PROFILE)


def _hypothesis_line(config: pytest.Config) -> str:
    current = settings()
    if current.derandomize:
        seed = "derandomized: each test's examples derive from its own source, the same on every machine"
    else:
        given = config.getoption("hypothesis_seed", None)
        seed = (f"--hypothesis-seed={given}" if given is not None else
                "random: a failure prints its @reproduce_failure blob; rerun with --hypothesis-seed=N to fix one")
    return (f"hypothesis profile {PROFILE!r} (HYPOTHESIS_PROFILE / CI): max_examples={current.max_examples}, "
            f"{seed}")


def pytest_report_header(config: pytest.Config) -> str:
    """Which examples this run draws (xdist workers load the same profile from the same environment)."""
    return _hypothesis_line(config)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    # Again at the end: the suites run with -q, which hides the header.
    terminalreporter.write_line(_hypothesis_line(config))

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
