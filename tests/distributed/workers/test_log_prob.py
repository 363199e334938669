"""compute_log_prob of the actor and of the frozen reference (ZeRO-3 inference engine or plain
module) equals a single-process forward, with fixed and token-budget micro-batches (fp32; the
tolerance is the error model's, ``helpers.forward_tol``: the workers' micro-batches, ZeRO-3
gathers and chunked log-probs sum in another order than one whole-batch forward)."""

from __future__ import annotations

import torch

from repro.rl.algorithms import entropy_from_logits, logprobs_from_logits
from tests.distributed.workers.helpers import (
    ZERO3_PARTITION_ALL,
    forward_tol,
    make_cfg,
    make_model_dir,
    make_step_batch,
    shard,
)

SAMPLES = 8
SEQ = 12  # make_step_batch: prompt 6 + response 6


def _log_probs(rank: int, world: int, model_dir: str) -> list[dict]:
    from repro.workers.actor import ActorWorker

    batch = shard(make_step_batch(21, SAMPLES), rank, world)
    out = []
    for role, stage, dynamic in (("actor", 2, False), ("ref", 3, False), ("ref", 2, True), ("actor", 3, True)):
        cfg = make_cfg(model_dir, world=world, stage=stage, micro=1)
        cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu = 3
        for section in (cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.ref):
            section.log_prob_use_dynamic_bsz = dynamic
            section.log_prob_max_token_len_per_gpu = 20
        worker = ActorWorker(cfg, role=role, ds_overrides=ZERO3_PARTITION_ALL if stage == 3 else None)
        res = worker.compute_log_prob(batch, calculate_entropy=True)
        out.append({"case": (role, stage, dynamic), **res})
    return out


def test_actor_and_reference_log_probs_match_single_process_forward(pooled, tmp_path):
    from transformers import AutoModelForCausalLM

    model_dir = make_model_dir(tmp_path / "model")
    results = pooled(_log_probs, 2, timeout_s=120, args=(model_dir,))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for rank in range(2):
        mb = shard(make_step_batch(21, SAMPLES), rank, 2)
        with torch.no_grad():
            logits = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"],
                           position_ids=mb["position_ids"]).logits[:, -mb["responses"].shape[1] - 1:-1]
        want_lp = logprobs_from_logits(logits, mb["responses"])
        want_ent = entropy_from_logits(logits)
        mask = mb["response_mask"].bool()
        for res in results[rank]:
            for key, want in (("log_probs", want_lp[mask]), ("entropy", want_ent[mask])):
                diff = (res[key][mask] - want).abs().max().item()
                assert diff <= forward_tol(SEQ, want), (res["case"], key, diff, forward_tol(SEQ, want))
