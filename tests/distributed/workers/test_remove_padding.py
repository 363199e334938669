"""``use_remove_padding=True`` (packed rows, position_ids only) gives the padded batch's
log-probs, values, losses and gradients on 2 gloo ranks, at every ZeRO stage, with fixed and
token-budget micro-batches (fp32, tolerances from the error model in ``helpers``).

What remove-padding could get wrong is the forward and backward of the packed rows (samples
attending across each other, wrong positions, outputs scattered to the wrong slots), so the
claim is checked where it lives: outputs, losses and every optimizer step's gradient before the
optimizer. The optimizer is the same code on both paths; parameters after the steps are compared
only through its bounded gain (AdamW with eps = lr, ``helpers.PARITY_ADAM_EPS_PER_LR``). That the
packed path really ran is read back from what the engine fed the model (``RoleEngine.report``):
rows without an attention mask, fewer tokens than the padded shard (the padded path's rows carry one).
"""

from __future__ import annotations

import pytest

from tests.distributed.workers.helpers import (
    ADAM_GAIN,
    FP32_EPS,
    PARITY_ADAM_EPS_PER_LR,
    ZERO3_PARTITION_ALL,
    forward_tol,
    fp32_tol,
    full_grads,
    grad_tol,
    make_cfg,
    make_model_dir,
    make_step_batch,
    params_of,
    shard,
    toy_chain,
    train_steps,
)

SAMPLES = 8
SEQ = 12  # prompt 6 + response 6
STEPS = 2  # update calls; 2 mini-batches each
LOSS_KEYS = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "critic/vf_loss")


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
            for section in (cfg.actor_rollout_ref.actor, cfg.critic):
                section.optim.eps = PARITY_ADAM_EPS_PER_LR * section.optim.lr
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
            fed = worker.engine.report()["fed"]  # the forward pass above: what the model received
            grads: list[dict] = []
            worker.engine.before_step = lambda engine, grads=grads: grads.append(full_grads(engine))
            init = params_of(worker)
            metrics = train_steps(worker, role, rank, world, range(STEPS), SAMPLES)
            params = params_of(worker)
            moved = max((params[k] - init[k]).abs().max().item() for k in params)
            out.append({"dynamic": dynamic, "rmpad": remove_padding, "forward": forward, "grads": grads, "fed": fed,
                        "metrics": metrics, "params": params, "moved": moved})
    return out


def check(results: list[list[dict]], stage: int, role: str) -> None:
    chain = toy_chain(SEQ)
    for rank in range(2):
        mask = shard(make_step_batch(31, SAMPLES), rank, 2)["response_mask"].bool()
        by_case = {(r["dynamic"], r["rmpad"]): r for r in results[rank]}
        shard_tokens = mask.shape[0] * SEQ  # the padded [B, P + R] shard
        real_tokens = int(shard(make_step_batch(31, SAMPLES), rank, 2)["attention_mask"].sum())
        for dynamic in (False, True):
            case = (stage, role, dynamic)
            off, on = by_case[(dynamic, False)], by_case[(dynamic, True)]
            # Engaged: the padded path fed rows with their mask, each micro-batch at its own width (its
            # longest prompt and response: repro.batching.batch.trimmed); the packed path fed mask-free
            # rows holding every real token and fewer than the padded shard.
            assert off["fed"]["masked"] == off["fed"]["forwards"] > 0, (*case, off["fed"])
            assert real_tokens <= off["fed"]["tokens"] <= shard_tokens and max(off["fed"]["widths"]) <= SEQ, \
                (*case, off["fed"])
            assert on["fed"]["forwards"] > 0 and on["fed"]["masked"] == 0, (*case, on["fed"])
            assert real_tokens <= on["fed"]["tokens"] < shard_tokens, (*case, on["fed"], real_tokens)
            for key in off["forward"]:
                want = off["forward"][key][mask]
                diff = (want - on["forward"][key][mask]).abs().max().item()
                assert diff <= forward_tol(SEQ, want), (*case, key, diff, forward_tol(SEQ, want))
                assert (on["forward"][key][~mask] == 0).all()
            for m_off, m_on in zip(off["metrics"], on["metrics"], strict=True):
                for key in LOSS_KEYS:
                    if key in m_off:
                        # a mean over at most SAMPLES * SEQ tokens of per-token terms
                        tol = fp32_tol(chain + SAMPLES * SEQ, max(abs(m_off[key]), 1.0))
                        assert abs(m_off[key] - m_on[key]) <= tol, (*case, key, m_off[key], m_on[key], tol)
            # every optimizer step's gradient: the mini-batch's tokens (its share on every rank)
            assert len(off["grads"]) == len(on["grads"]) == 2 * STEPS, case
            g_tol = 0.0
            for step, (g_off, g_on) in enumerate(zip(off["grads"], on["grads"], strict=True)):
                tol = grad_tol(SEQ, SAMPLES // 2 * SEQ, g_off)
                g_tol = max(g_tol, tol)
                diff = max((g_off[k] - g_on[k]).abs().max().item() for k in g_off)
                assert diff <= tol, (*case, "gradient of step", step, diff, tol)
            # Parameters: each step moves them apart by at most ADAM_GAIN * lr / eps (= ADAM_GAIN)
            # times the gradient difference, plus the rounding of the update itself (eps * |p|).
            p_tol = 2 * STEPS * (ADAM_GAIN / PARITY_ADAM_EPS_PER_LR * g_tol + FP32_EPS)
            diff = max((off["params"][k] - on["params"][k]).abs().max().item() for k in off["params"])
            assert diff <= p_tol, (*case, "params", diff, p_tol)
            assert on["moved"] > 10 * p_tol, (*case, "the updates are too small to compare", on["moved"])


@pytest.mark.parametrize("role", ["actor", "critic"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_remove_padding_equals_padded_forward_losses_and_gradients(pooled, tmp_path, stage, role):
    model_dir = make_model_dir(tmp_path / "model")
    results = pooled(_run, 2, timeout_s=120, args=(model_dir, stage, role))
    check(results, stage, role)
