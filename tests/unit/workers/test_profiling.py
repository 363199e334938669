"""``trainer.profile_steps``: a rank's step under torch.profiler leaves its operator tables and trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from repro.config.loader import load_config
from repro.workers.profiling import StepProfiler


def test_a_profiled_step_writes_the_operators_it_ran_with_their_call_counts(tmp_path: Path) -> None:
    prof = StepProfiler(tmp_path / "profile", rank=1)
    prof.start(3)
    a = torch.randn(16, 16)
    for _ in range(7):
        a = torch.mm(a, a).tanh()
    path = prof.stop()
    assert path == tmp_path / "profile" / "step3_rank1.txt"
    text = path.read_text()
    assert text.startswith("step 3, rank 1:")
    mm = next(line for line in text.splitlines() if line.strip().startswith("aten::mm "))
    assert " 7 " in f" {mm} ", mm  # the call count column: seven launches, not one
    trace = json.loads((tmp_path / "profile" / "step3_rank1.trace.json").read_text())
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])


def test_the_profiler_refuses_a_stop_without_a_start_and_a_second_start(tmp_path: Path) -> None:
    prof = StepProfiler(tmp_path, rank=0)
    with pytest.raises(RuntimeError, match="without a start"):
        prof.stop()
    prof.start(1)
    with pytest.raises(RuntimeError, match="step 1 still running when step 2 starts"):
        prof.start(2)
    prof.stop()


@pytest.mark.parametrize("steps", ["[0]", "[2,-1]"])
def test_profile_steps_must_be_step_numbers(steps: str) -> None:
    with pytest.raises(ValueError, match=r"trainer.profile_steps=.* must list step numbers >= 1"):
        load_config([f"trainer.profile_steps={steps}"], config_name="grpo_tiny")


def test_a_profile_step_after_the_last_step_is_refused_instead_of_never_running() -> None:
    with pytest.raises(ValueError, match=r"profile_steps=\[5, 61\] lists a step after the last "
                                         r"\(trainer.total_training_steps=60\)"):
        load_config(["trainer.profile_steps=[5,61]"], config_name="grpo_tiny")
    assert load_config(["trainer.profile_steps=[60]"], config_name="grpo_tiny").trainer.profile_steps == [60]
