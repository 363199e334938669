"""``enable_gradient_checkpointing=auto`` on 2 gloo ranks: the first update measures and every rank takes the same
decision, read back from the model's layers (the engine report), and a run that turned it on trains bitwise as one
built with it on (``repro.workers.activation_checkpointing``)."""

from __future__ import annotations

import pytest

from tests.distributed.workers.helpers import make_cfg, make_model_dir, make_step_batch, params_of, shard

SAMPLES = 8  # train_batch_size 4 x n 2


def _updates(rank: int, world: int, model_dir: str, stage: int, cases: list) -> list[dict]:
    from repro.workers.actor import ActorWorker
    from repro.workers.critic import CriticWorker

    out = []
    for role, setting, rank_tokens in cases:
        cfg = make_cfg(model_dir, world=world, stage=stage, micro=1)
        cfg.actor_rollout_ref.model.enable_gradient_checkpointing = setting
        cfg.critic.model.enable_gradient_checkpointing = setting
        worker = ActorWorker(cfg) if role == "actor" else CriticWorker(cfg)
        before = worker.engine.report()
        if rank in rank_tokens:  # this rank's plan as if it could get a micro-batch this large
            worker.engine.auto_checkpointing_tokens = rank_tokens[rank]
        update = worker.update_policy if role == "actor" else worker.update_critic
        metrics = update(shard(make_step_batch(7, SAMPLES), rank, world))
        out.append({"before": before, "after": worker.engine.report(), "params": params_of(worker),
                    "metric": metrics.get(f"{role}/gradient_checkpointing")})
    return out


@pytest.mark.parametrize("stage", [2, 3])
def test_auto_decides_at_the_first_update_the_same_on_every_rank_and_trains_as_checkpointing_on(stage, pooled,
                                                                                               tmp_path):
    model_dir = make_model_dir(tmp_path / "model")
    # The tiny model's micro-batch fits this host many times over: off, and the measurement kept. Rank 1 alone
    # could get a micro-batch whose activations fit nowhere: both ranks turn it on (a rank-local choice would give
    # the ranks different backward passes). And checkpointing on from the build, for the weights.
    # The critic's engine decides the same way, from its own section's key.
    cases = [("actor", "auto", {}), ("actor", "auto", {1: 10**12}), ("actor", True, {}), ("critic", "auto", {1: 10**12})]
    ranks = pooled(_updates, 2, timeout_s=120, args=(model_dir, stage, cases))
    for rank in range(2):
        fits, one_rank_needs, built_on, critic = ranks[rank]
        assert critic["after"]["gradient_checkpointing"] and critic["after"]["checkpointing_auto"]["on"]
        # The choice in the step's metrics (what metrics.tsv keeps); no such metric without auto.
        assert (fits["metric"], one_rank_needs["metric"], built_on["metric"], critic["metric"]) == (0.0, 1.0, None, 1.0)
        assert fits["before"]["checkpointing_auto"] is None and not fits["before"]["gradient_checkpointing"]
        decided = fits["after"]["checkpointing_auto"]
        assert decided["on"] is False and not fits["after"]["gradient_checkpointing"], decided
        assert decided["bytes_per_token"] > 0 and decided["free_bytes"] > 0, decided
        # The toy model's fp32 parameters, counted whole at every stage (ZeRO-3's partitions by ds_numel).
        assert decided["grad_bytes"] == 4 * sum(t.numel() for t in fits["params"].values()), decided
        assert decided["tokens"] == 6 + 6, decided  # one sample a micro-batch at max_prompt + max_response length
        agreed = one_rank_needs["after"]
        assert agreed["gradient_checkpointing"] and agreed["checkpointing_auto"]["on"], agreed["checkpointing_auto"]
        assert agreed["checkpointing_auto"]["tokens"] == 10**12
        assert built_on["before"]["gradient_checkpointing"] and built_on["after"]["checkpointing_auto"] is None
        # Turned on at the first update, it is the same recomputation as turned on at build: bitwise.
        for name, value in built_on["params"].items():
            assert one_rank_needs["params"][name].equal(value), name
