"""``trainer.profile_steps``: a rank's step under torch.profiler leaves its operator tables and trace."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch

from repro.config.loader import load_config
from repro.workers.profiling import StepProfiler, module_phase, phase


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


class _RMSNorm(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm, self.self_attn, self.mlp = _RMSNorm(), torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.self_attn(self.input_layernorm(x)).relu())


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens, self.layer, self.lm_head = torch.nn.Embedding(10, 8), _Block(), torch.nn.Linear(8, 10)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = torch.utils.checkpoint.checkpoint(self.layer, self.embed_tokens(ids), use_reentrant=False)
        return self.lm_head(h)


def test_modules_get_their_phase_by_name_and_class() -> None:
    m = _Model()
    assert {n: module_phase(n, mod) for n, mod in m.named_modules() if module_phase(n, mod)} == {
        "embed_tokens": "embedding", "layer.input_layernorm": "norm", "layer.self_attn": "attention",
        "layer.mlp": "mlp", "lm_head": "lm_head"}


def test_phase_ranges_exist_only_while_profiling_and_a_recomputed_forward_opens_them_again(tmp_path: Path) -> None:
    model = _Model()
    assert isinstance(phase("optimizer"), contextlib.nullcontext)
    prof = StepProfiler(tmp_path, rank=0)
    prof.start(1, models=[model])
    assert not isinstance(phase("optimizer"), contextlib.nullcontext)
    model(torch.tensor([[1, 2, 3]])).sum().backward()  # the block is checkpointed: its forward runs twice
    with phase("optimizer"):
        torch.zeros(1).add_(1)
    prof.stop()
    assert isinstance(phase("optimizer"), contextlib.nullcontext)
    assert all(not mod._forward_pre_hooks and not mod._forward_hooks for mod in model.modules())  # hooks removed
    events = json.loads((tmp_path / "step1_rank0.trace.json").read_text())["traceEvents"]
    ranges = [e["name"] for e in events if e.get("cat") == "user_annotation"]
    assert {r: ranges.count(r) for r in set(ranges)} == {
        "repro::embedding": 1, "repro::lm_head": 1, "repro::optimizer": 1,
        "repro::norm": 2, "repro::attention": 2, "repro::mlp": 2}


class _Layers(torch.nn.Module):
    """Two decoder-like blocks between an embedding and an LM head, called as a model calls its layers."""

    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens, self.lm_head = torch.nn.Embedding(10, 8), torch.nn.Linear(8, 10)
        self.layers = torch.nn.ModuleList([_Block(), _Block()])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed_tokens(ids)
        for layer in self.layers:
            h = layer(h)
        return self.lm_head(h)


def test_compiled_layers_carry_no_phase_hooks_and_their_profiled_time_is_labelled_from_dynamos_regions(
        tmp_path: Path, monkeypatch) -> None:
    """``model.compile_layers``' layers under the profiler: a hook inside a compiled call is either a new graph
    (the recompile session 22 profiled on an H200) or silently dropped, so none goes there; the trace's
    compiled regions carry their time instead (``compiled_layers``), forward and backward."""
    from repro.bench.profile_phases import attribute
    from repro.bench.trace_events import COMPILED
    from repro.workers.layer_compile import captured_graphs

    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)  # the suites switch dynamo off (conftest.py)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _Layers()
    for layer in model.layers:
        layer.compile(backend="aot_eager", dynamic=True)  # torch's own kernels: no C++ build on CPU
    ids = torch.randint(0, 10, (2, 5))
    model(ids).sum().backward()  # the warm pass compiles the layers' forward and backward
    graphs = captured_graphs()
    assert graphs >= 1
    prof = StepProfiler(tmp_path, rank=0)
    prof.start(1, models=[model])
    hooked = {n for n, m in model.named_modules() if m._forward_pre_hooks or m._forward_hooks}
    assert hooked == {"embed_tokens", "lm_head"}  # nothing inside layers.0 / layers.1
    model(ids).sum().backward()
    prof.stop()
    assert captured_graphs() == graphs  # the profiled pass ran the warm graphs, compiled nothing
    trace = json.loads((tmp_path / "step1_rank0.trace.json").read_text())
    phases = attribute(trace)["phases"]
    assert phases.get(COMPILED, 0) > 0 and not {"attention", "mlp", "norm"} & set(phases), phases
    assert phases[COMPILED] > phases.get("unlabeled", 0), phases  # the layers' ops, forward and backward, are labelled
