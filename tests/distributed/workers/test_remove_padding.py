"""``use_remove_padding=True`` (packed rows, position_ids only) gives the padded batch's
log-probs, values, losses and updates on 2 gloo ranks, at every ZeRO stage, with fixed and
token-budget micro-batches (fp32, 1e-5)."""

from __future__ import annotations

import pytest

from tests.distributed.workers.helpers import (
    ZERO3_PARTITION_ALL,
    make_cfg,
    make_model_dir,
    make_step_batch,
    params_of,
    shard,
    train_steps,
)

SAMPLES = 8
TOL = 1e-5


def _run(rank: int, world: int, model_dir: str, stage: int, role: str) -> list[dict]:
    from repro.workers.actor import ActorWorker
    from repro.workers.critic import CriticWorker

    out = []
    batch = shard(make_step_batch(31, SAMPLES), rank, world)
    for dynamic in (False, True):
        for remove_padding in (False, True):
            # a 14-token budget: micro-batches of one or two samples, packed rows below the padded width
            cfg = make_cfg(model_dir, world=world, stage=stage, micro=2, dynamic=dynamic, max_tokens=14,
                           use_kl_loss=True, entropy_coeff=0.01)
            cfg.actor_rollout_ref.model.use_remove_padding = remove_padding
            cfg.critic.model.use_remove_padding = remove_padding
            for section in (cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.ref):
                section.log_prob_use_dynamic_bsz = dynamic
                section.log_prob_max_token_len_per_gpu = 14
            cfg.critic.use_dynamic_bsz = dynamic
            overrides = ZERO3_PARTITION_ALL if stage == 3 else None
            if role == "actor":
                worker = ActorWorker(cfg, ds_overrides=overrides)
                forward = worker.compute_log_prob(batch, calculate_entropy=True)
            else:
                worker = CriticWorker(cfg, ds_overrides=overrides)
                forward = worker.compute_values(batch)
            init = params_of(worker)
            metrics = train_steps(worker, role, rank, world, range(2), SAMPLES)
            params = params_of(worker)
            moved = max((params[k] - init[k]).abs().max().item() for k in params)
            out.append({"dynamic": dynamic, "rmpad": remove_padding, "forward": forward,
                        "metrics": metrics, "params": params, "moved": moved})
    return out


@pytest.mark.parametrize("role", ["actor", "critic"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_remove_padding_equals_padded_forward_losses_and_updates(pooled, tmp_path, stage, role):
    model_dir = make_model_dir(tmp_path / "model")
    results = pooled(_run, 2, timeout_s=120, args=(model_dir, stage, role))
    for rank in range(2):
        mask = shard(make_step_batch(31, SAMPLES), rank, 2)["response_mask"].bool()
        by_case = {(r["dynamic"], r["rmpad"]): r for r in results[rank]}
        for dynamic in (False, True):
            off, on = by_case[(dynamic, False)], by_case[(dynamic, True)]
            for key in off["forward"]:
                diff = (off["forward"][key][mask] - on["forward"][key][mask]).abs().max().item()
                assert diff < TOL, (stage, role, dynamic, key, diff)
                assert (on["forward"][key][~mask] == 0).all()
            for m_off, m_on in zip(off["metrics"], on["metrics"], strict=True):
                for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "critic/vf_loss"):
                    if key in m_off:
                        assert abs(m_off[key] - m_on[key]) < TOL, (stage, role, dynamic, key)
            diff = max((off["params"][k] - on["params"][k]).abs().max().item() for k in off["params"])
            assert diff < TOL, (stage, role, dynamic, "params", diff)
            assert on["moved"] > 100 * TOL  # the updates are real, so equal parameters mean equal updates
