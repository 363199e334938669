"""The CPU main job (``grpo_tiny``, 10 steps, 2 CPU ranks) against its checked-in per-step golden.

``scripts/goldens.py --check`` runs the job and compares every metric of every step bitwise
with ``fixtures/goldens/grpo_tiny_cpu.json`` (why exact, and why keyed on the tiny policy's
weight digest, torch and the CPU's kernel paths rather than a cross-machine bound: the script's
docstring). On a machine that differs in any of them it prints ``SKIP: ...`` and the test skips
with that line. Regenerate with ``python scripts/goldens.py --update`` after an intended change.
"""

from __future__ import annotations

import sys

import pytest

from tests import jobs


@pytest.mark.slow
def test_grpo_tiny_cpu_matches_golden(tmp_path, ray_head):
    # One 10-step job (~70 s on 2 quiet cores). It joins the worker's shared Ray head and its kept
    # rank processes (jobs.job_env with ray_head) instead of starting a cluster and two fresh
    # ranks of its own (~15 CPU s): a kept rank starts the next job in its pre-run state
    # (repro/cluster/rank_reset.py, proven by tests/distributed/cluster/test_reuse.py, and bitwise
    # by the kill -9 resume), so the comparison is the same bitwise one a hand-run script makes,
    # and it still fails on any changed bit of any step.
    proc = jobs.run([sys.executable, "scripts/goldens.py", "--check"], jobs.job_env(tmp_path, ray_head), timeout=600,
                    check=False)
    out = proc.stdout.strip()
    if out.startswith("SKIP:"):
        pytest.skip(out)
    assert proc.returncode == 0, f"per-step metrics differ from the golden:\n{out}\n{proc.stderr[-3000:]}"
