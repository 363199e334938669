"""The GPU gate's memory budget with vLLM (``tests.jobs.with_vllm_engine``) against the recorded 0.6B gate runs.

The 0.6B case's budget is the trainer's share in ``fixtures/gpu_budgets.json`` plus 1.10 x vLLM's allowance
(``gpu_memory_utilization`` x the GPU's memory). Both recorded runs fit it on their own GPUs: 2 H100s of 81,559 MiB
(``results/seed_scale/raw/grpo_0p6b_seed1_metrics.tsv``) and 2 H200s of 143,771 MiB
(``results/seed_scale/raw/2026-11-28-h200x2-gate/``); the H200 run would fail the H100 figure the budget was before,
and a trainer that grew by half its share fails on both.
"""

from __future__ import annotations

import json

import pytest

from repro.rl.metrics import MetricsLog
from tests import jobs
from tests.jobs import ROOT

MIB = 2**20
TRAINER = json.loads((ROOT / "fixtures" / "gpu_budgets.json").read_text())["grpo_0p6b_zero2_vllm"]
H200_RUN = ROOT / "results" / "seed_scale" / "raw" / "2026-11-28-h200x2-gate"
RUNS = [  # (recorded metrics, the GPU's memory as nvidia-smi printed it beside the run)
    pytest.param(ROOT / "results" / "seed_scale" / "raw" / "grpo_0p6b_seed1_metrics.tsv", 81559 * MIB, id="2xH100"),
    pytest.param(H200_RUN / "metrics.tsv", 143771 * MIB, id="2xH200"),
]
KEYS = {"max_memory_reserved_gb": "perf/max_memory_reserved_gb", "max_nvml_memory_used_gb": "perf/nvml_memory_used_gb"}


def _peaks(path) -> dict[str, float]:
    rows = MetricsLog(path).rows
    return {key: max(r[col] for r in rows) for key, col in KEYS.items()}


def _util() -> float:
    return jobs.run_config(H200_RUN)["actor_rollout_ref"]["rollout"]["gpu_memory_utilization"]


@pytest.mark.parametrize(("metrics", "gpu_bytes"), RUNS)
def test_each_recorded_0p6b_gate_run_fits_the_budget_of_its_own_gpu(metrics, gpu_bytes):
    budget = jobs.with_vllm_engine(TRAINER, _util(), gpu_bytes)
    peaks = _peaks(metrics)
    assert all(peaks[k] <= budget[k] for k in KEYS), (peaks, budget)


@pytest.mark.parametrize(("metrics", "gpu_bytes"), RUNS)
def test_a_trainer_half_again_as_large_fails_the_budget(metrics, gpu_bytes):
    util = _util()
    engine_gb = util * gpu_bytes / 2**30
    peaks = _peaks(metrics)
    grown = {k: v + 0.5 * (v - engine_gb) for k, v in peaks.items()}  # the trainer's share x 1.5, vLLM the same
    budget = jobs.with_vllm_engine(TRAINER, util, gpu_bytes)
    assert all(grown[k] > budget[k] for k in KEYS), (grown, budget)


def test_the_h200_run_exceeds_a_budget_fixed_on_an_h100():
    h100 = jobs.with_vllm_engine(TRAINER, _util(), 81559 * MIB)
    assert _peaks(H200_RUN / "metrics.tsv")["max_memory_reserved_gb"] > h100["max_memory_reserved_gb"]
