"""LoRA actor (peft adapters) on 2 gloo ranks at ZeRO-2 and ZeRO-3: only the adapters train,
the merged weights the rollout receives reproduce the engine's logits, the reference is the
base model with adapters disabled, and a resumed run equals the uninterrupted one bitwise. That LoRA
was engaged is read back (``RoleEngine.report``): peft's adapter layers on the model, and
DeepSpeed's optimizer updating adapters only.

Logits and log-probs are compared with the fp32 error model (``tests/error_model.py``): the engine
adds x A B to the base product where the merged model multiplies by W + s B A, and peft, ZeRO's
gathered weights and the chunked log-probs sum in other orders than one plain forward."""

from __future__ import annotations

import os

import pytest
import torch

from repro.rl.algorithms import logprobs_from_logits
from tests.distributed.workers.helpers import (
    ZERO3_PARTITION_ALL,
    forward_tol,
    fp32_tol,
    make_cfg,
    make_model_dir,
    make_step_batch,
    params_of,
    shard,
    toy_chain,
    train_steps,
)

SAMPLES = 8
SEQ = 12  # make_step_batch: prompt 6 + response 6
LORA_RANK = 4
SAVE_AT, TOTAL = 1, 3


def _actor(model_dir: str, stage: int, world: int):
    from repro.workers.actor import ActorWorker

    cfg = make_cfg(model_dir, world=world, stage=stage, micro=1, use_kl_loss=True, lr=5e-2)
    cfg.actor_rollout_ref.model.lora_rank = LORA_RANK
    cfg.actor_rollout_ref.model.lora_alpha = 8
    return ActorWorker(cfg, ds_overrides=ZERO3_PARTITION_ALL if stage == 3 else None)


def _named(worker, adapters: bool) -> dict[str, torch.Tensor]:
    from repro.workers import lora

    zero3 = worker.ds.zero_stage == 3
    out = {}
    for name, param in worker.engine.module.named_parameters():
        if (".lora_" in name) == adapters:
            with lora._gathered([param], zero3):
                out[name] = param.data.detach().float().cpu().clone()
    return out


def _run(rank: int, world: int, model_dir: str, stage: int, root: str) -> dict:
    worker = _actor(model_dir, stage, world)
    engaged = worker.engine.report()
    trainable = sorted(n for n, p in worker.engine.module.named_parameters() if p.requires_grad)
    base0, adapters0 = _named(worker, False), _named(worker, True)
    merged0 = params_of(worker)
    metrics = train_steps(worker, "actor", rank, world, range(SAVE_AT), SAMPLES)
    worker.save_checkpoint(os.path.join(root, f"step_{SAVE_AT}"), SAVE_AT, {})
    metrics += train_steps(worker, "actor", rank, world, range(SAVE_AT, TOTAL), SAMPLES)
    batch = shard(make_step_batch(77, SAMPLES), rank, world)
    with torch.no_grad():
        logits = worker.engine.forward(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                       position_ids=batch["position_ids"], use_cache=False).logits
    worker.export_lora_adapter(os.path.join(root, "adapter"))
    out = {
        "engaged": engaged, "trainable": trainable, "base0": base0, "base1": _named(worker, False),
        "adapters0": adapters0, "adapters1": _named(worker, True), "merged0": merged0,
        "merged1": params_of(worker), "logits": logits, "metrics": metrics,
        "ref_log_probs": worker.compute_log_prob(batch, without_adapters=True)["log_probs"],
    }
    resumed = _actor(model_dir, stage, world)
    resumed.load_checkpoint(os.path.join(root, f"step_{SAVE_AT}"))
    out["resumed_metrics"] = train_steps(resumed, "actor", rank, world, range(SAVE_AT, TOTAL), SAMPLES)
    out["resumed_merged"] = params_of(resumed)
    return out


@pytest.mark.parametrize("stage", [2, 3])
def test_lora_trains_only_adapters_exports_merged_weights_and_resumes_bitwise(pooled, tmp_path, stage):
    from transformers import AutoModelForCausalLM

    model_dir = make_model_dir(tmp_path / "model")
    root = str(tmp_path / "ckpt")
    results = pooled(_run, 2, timeout_s=120, args=(model_dir, stage, root))
    res = results[0]
    # Engaged: an adapter on every linear layer of the decoder (all-linear: q, k, v, o, gate, up,
    # down per layer), and DeepSpeed's optimizer holding their A and B matrices and nothing else.
    from repro.data.tiny_model import toy_qwen3_config

    for rank_result in results:
        engaged = rank_result["engaged"]
        layers = 7 * toy_qwen3_config().num_hidden_layers
        assert engaged["lora_layers"] == layers and engaged["optimizer_params"] == 2 * layers, engaged
        assert engaged["optimizer_base_params"] == 0 and engaged["trainable_base_params"] == 0, engaged
    assert res["trainable"] and all(".lora_" in n for n in res["trainable"])
    for key in res["base0"]:  # the base never changes
        assert torch.equal(res["base0"][key], res["base1"][key]), key
    assert max((res["adapters1"][k] - res["adapters0"][k]).abs().max().item() for k in res["adapters0"]) > 1e-3
    # merged export: equal to the base at start (B = 0), different after training, HF names
    base_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    base_state = {k: v for k, v in base_model.state_dict().items() if k != "lm_head.weight"}
    assert set(res["merged0"]) == {n for n, _ in base_model.named_parameters()}
    assert all(torch.equal(res["merged0"][k], base_state[k]) for k in res["merged0"] if k in base_state)
    assert max((res["merged1"][k] - res["merged0"][k]).abs().max().item() for k in res["merged0"]) > 1e-4
    merged_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    merged_model.load_state_dict(res["merged1"], strict=False)
    from peft import PeftModel

    adapter_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), os.path.join(root, "adapter")).eval()
    for rank in range(2):
        batch = shard(make_step_batch(77, SAMPLES), rank, 2)
        with torch.no_grad():
            kwargs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
            want = merged_model(**kwargs).logits
            from_adapter = adapter_model(**kwargs).logits
            base_logits = base_model(**kwargs).logits
        # every logit: the model's chain with the adapters' extra sums, at the logits' magnitude
        tol = fp32_tol(toy_chain(SEQ, lora_rank=LORA_RANK), want.abs().max())
        for other in (want, from_adapter):
            diff = (results[rank]["logits"] - other).abs().max().item()
            assert diff <= tol, (rank, diff, tol)
        # the reference: the base model, adapters disabled
        resp = batch["responses"].shape[1]
        ref = logprobs_from_logits(base_logits[:, -resp - 1:-1], batch["responses"])
        mask = batch["response_mask"].bool()
        diff = (results[rank]["ref_log_probs"][mask] - ref[mask]).abs().max().item()
        assert diff <= forward_tol(SEQ, ref[mask]), (rank, diff, forward_tol(SEQ, ref[mask]))
    # resume: the same metrics and weights, bitwise
    assert res["resumed_metrics"] == res["metrics"][SAVE_AT:]
    for key in res["merged1"]:
        assert torch.equal(res["resumed_merged"][key], res["merged1"][key]), key
    # the checkpoint holds the adapters, not the frozen base
    ds_dir = os.path.join(root, f"step_{SAVE_AT}", "ds", "ckpt")
    states = [f for f in os.listdir(ds_dir) if "model_states" in f]
    assert states
    for name in states:
        module = torch.load(os.path.join(ds_dir, name), weights_only=False, map_location="cpu")["module"]
        frozen = {k for k in (module or {}) if ".lora_" not in k}
        # lm_head.weight is tied to the embedding: named_parameters() lists the pair once, so
        # DeepSpeed's exclude_frozen_parameters keeps the alias (a frozen copy, ignored on load).
        assert frozen <= {"base_model.model.lm_head.weight"}, sorted(frozen)
