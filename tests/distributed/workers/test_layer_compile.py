"""Compiled decoder layers (``actor_rollout_ref.model.compile_layers``, ``repro.workers.layer_compile``) train exactly
as the eager ones.

Two gloo ranks, ZeRO-2, remove-padding and gradient checkpointing on (the rmpad bench's path), two
``update_policy`` calls each, with each layer compiled (``model.compile_scope=layer``) or the whole decoder stack
(``stack``). Backend ``aot_eager``: dynamo and AOTAutograd capture each layer's forward and
backward and torch's own kernels run the captured graphs, so the arithmetic is the eager one and the comparison is
bitwise (inductor's generated kernels would round otherwise: ``tests/gpu_e2e/test_layer_compile_gpu.py``). What ran
compiled is read back from the engine's report (layers compiled) and from dynamo (graphs captured), not from the key.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.distributed.workers.helpers import make_cfg, make_model_dir, params_of, train_steps

pytestmark = pytest.mark.distributed

SAMPLES = 8


def _train(rank: int, world: int, model_dir: str, compiled: bool, scope: str = "layer") -> dict:
    from repro.workers.actor import ActorWorker
    from repro.workers.layer_compile import captured_graphs

    cfg = make_cfg(model_dir, world=world, stage=2, n=2, train_batch_size=SAMPLES // 2, mini=SAMPLES // world,
                   micro=None, dynamic=True, max_tokens=40)
    cfg.actor_rollout_ref.model.use_remove_padding = True
    cfg.actor_rollout_ref.model.enable_gradient_checkpointing = True
    cfg.actor_rollout_ref.model.compile_layers = "aot_eager" if compiled else "off"
    cfg.actor_rollout_ref.model.compile_scope = scope
    # The suites switch dynamo off (TORCHDYNAMO_DISABLE=1, conftest.py: nothing else compiles, and it keeps
    # DeepSpeed's import light), which torch.compile reads when it is called and then silently does nothing: unset
    # for this task only, and the graphs dynamo captured are counted, so a no-op compile fails the test.
    disabled = os.environ.pop("TORCHDYNAMO_DISABLE", None)
    try:
        torch._dynamo.reset()
        # counted from here: dynamo's counters outlive its reset, and a warm rank of the pool ran other compiles
        before = captured_graphs()
        worker = ActorWorker(cfg)
        layers = worker.engine.report()["compiled_layers"]
        metrics = train_steps(worker, "actor", rank, world, range(1), SAMPLES)
        first = captured_graphs() - before
        metrics += train_steps(worker, "actor", rank, world, range(1, 2), SAMPLES)  # other lengths, other packing
        graphs = captured_graphs() - before
    finally:
        torch._dynamo.reset()  # the pool's warm rank runs other tests next: no compiled code stays behind
        if disabled is not None:
            os.environ["TORCHDYNAMO_DISABLE"] = disabled
    return {"params": params_of(worker), "metrics": metrics, "graphs": graphs, "first": first, "layers": layers}


# layer: each of the tiny model's 2 decoder layers its own region; stack: the base model holding them, one region
SCOPES = {"layer": 2, "stack": 1}


def test_compiled_decoder_layers_train_bitwise_as_the_eager_ones_in_either_scope(pooled, tmp_path):
    model_dir = make_model_dir(tmp_path / "model")
    eager = pooled(_train, 2, timeout_s=180, args=(model_dir, False))
    assert [r["graphs"] for r in eager] == [0, 0] and [r["layers"] for r in eager] == [0, 0]
    moved = [n for n, p in eager[0]["params"].items() if not torch.equal(p, params_of_initial(model_dir)[n])]
    assert moved, "the updates changed no parameter: the comparison would hold for anything"
    for scope, modules in SCOPES.items():
        compiled = pooled(_train, 2, timeout_s=180, args=(model_dir, True, scope))
        assert min(r["graphs"] for r in compiled) > 0, scope  # dynamo captured and ran them
        # every variant compiled in the first update: the second, on other lengths, compiles nothing (dynamic shapes;
        # the GPU's varlen path: tests/gpu_e2e/test_layer_compile_gpu.py)
        assert [r["graphs"] for r in compiled] == [r["first"] for r in compiled], scope
        assert [r["layers"] for r in compiled] == [modules] * 2, scope  # the engine's read-back
        for rank in range(2):
            assert compiled[rank]["metrics"] == eager[rank]["metrics"], (scope, rank)
            for name, want in eager[rank]["params"].items():
                assert torch.equal(compiled[rank]["params"][name], want), (scope, rank, name)


def params_of_initial(model_dir: str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return {n: p.detach().clone() for n, p in model.named_parameters()}
