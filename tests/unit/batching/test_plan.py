"""Batch semantics (repro.batching.plan): plans, error messages with nearest valid values, token packing."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import assume, given

from repro.batching.plan import (
    BatchParams,
    BatchPlanError,
    data_parallel_size,
    plan_batch,
    sample_layout,
)
from repro.config import RunConfig
from repro.config.rules import plan_role_batch
from tests.strategies import any_batch_params, batch_rules_hold, valid_batch_params

PR_ACTOR = BatchParams(
    n_gpus_per_node=2,
    nnodes=1,
    sp=1,
    rollout_n=1,
    train_batch_size=64,
    ppo_mini_batch_size=32,
    ppo_micro_batch_size_per_gpu=2,
)


# ---- plans -----------------------------------------------------------------------------------------


def test_pr_benchmark_actor_plan_splits_mini_batch_across_two_ranks_once():
    plan = plan_batch(PR_ACTOR)
    assert (plan.world, plan.dp, plan.per_rank_mini, plan.micro, plan.gas) == (2, 2, 16, 2, 8)
    assert plan.train_batch_size == 32 and plan.num_mini_batches == 2


def test_grpo_plan_counts_samples_as_prompts_times_rollout_n():
    plan = plan_batch(replace(PR_ACTOR, rollout_n=4, ppo_micro_batch_size_per_gpu=1))
    assert plan.samples_per_step == 256 and plan.mini_batch_samples == 128
    assert (plan.per_rank_mini, plan.gas, plan.train_batch_size) == (64, 64, 128)


@given(valid_batch_params())
def test_valid_plans_hold_the_batch_identities(p):
    plan = plan_batch(p)
    assert plan.world == p.n_gpus_per_node * p.nnodes and plan.dp * plan.sp == plan.world
    assert plan.samples_per_step == p.train_batch_size * p.rollout_n
    assert plan.mini_batch_samples == p.ppo_mini_batch_size * p.rollout_n
    # Divided by dp exactly once: the per-rank mini-batches of all dp ranks make up the mini-batch.
    assert plan.per_rank_mini * plan.dp == plan.mini_batch_samples
    assert plan.train_batch_size == plan.micro * plan.gas * plan.dp * plan.sp
    assert plan.num_mini_batches * plan.mini_batch_samples == plan.samples_per_step
    if p.use_dynamic_bsz:
        assert (plan.micro, plan.gas) == (1, 1) and plan.max_token_len == p.ppo_max_token_len_per_gpu * p.sp
    else:
        assert plan.micro * plan.gas == plan.per_rank_mini and plan.max_token_len is None
        legacy_micro = None if p.ppo_micro_batch_size is None else p.ppo_micro_batch_size // plan.dp
        assert plan.micro == (p.ppo_micro_batch_size_per_gpu or legacy_micro)


@given(valid_batch_params(dynamic=False))
def test_every_sample_is_trained_once_per_mini_batch_across_dp_ranks(p):
    plan = plan_batch(p)
    layout = sample_layout(plan)
    assert len(layout) == plan.num_mini_batches
    seen: list[int] = []
    for mini in layout:
        assert len(mini) == plan.dp
        in_mini = [i for rank in mini for micro in rank for i in micro]
        assert len(in_mini) == len(set(in_mini)) == plan.mini_batch_samples
        for rank in mini:
            assert len(rank) == plan.gas and all(len(micro) == plan.micro for micro in rank)
        seen += in_mini
    assert sorted(seen) == list(range(plan.samples_per_step))


@given(any_batch_params())
def test_plan_succeeds_exactly_when_the_rules_hold(p):
    if batch_rules_hold(p):
        plan_batch(p)
    else:
        with pytest.raises(BatchPlanError):
            plan_batch(p)


_FIELD_OF_KEY_SUFFIX = {
    "data.train_batch_size": "train_batch_size",
    ".ppo_mini_batch_size": "ppo_mini_batch_size",
    ".ppo_micro_batch_size_per_gpu": "ppo_micro_batch_size_per_gpu",
    ".ppo_micro_batch_size": "ppo_micro_batch_size",
    ".ulysses_sequence_parallel_size": "sp",
    ".ppo_max_token_len_per_gpu": "ppo_max_token_len_per_gpu",
}


def _field(key: str) -> str:
    return next(f for suffix, f in _FIELD_OF_KEY_SUFFIX.items() if key.endswith(suffix))


@given(any_batch_params())
def test_invalid_plans_name_keys_and_suggest_the_nearest_valid_values(p):
    assume(not batch_rules_hold(p))
    with pytest.raises(BatchPlanError) as info:
        plan_batch(p)
    err = info.value
    message = str(err)
    assert err.keys and all(key in message for key in err.keys)
    assert all(key.startswith(("actor_rollout_ref.", "critic.", "data.", "trainer.")) for key in err.keys)
    for key, values in err.suggestions.items():
        field = _field(key)
        current = getattr(p, field)
        for value in values:
            assert str(value) in message
            fixed = replace(p, **{field: value})
            assert batch_rules_hold(fixed), (key, value)
            if field not in ("sp", "ppo_max_token_len_per_gpu"):
                # Nearest: nothing valid lies strictly between the current value and the suggestion.
                lo, hi = sorted((current, value))
                assert not any(batch_rules_hold(replace(p, **{field: v})) for v in range(lo + 1, hi))
    if err.combination:  # offered only where one key alone cannot fix it, and then it must work whole
        assert any(not values for values in err.suggestions.values())
        assert " ".join(f"{k}={v}" for k, v in err.combination.items()) in message
        assert batch_rules_hold(replace(p, **{_field(k): v for k, v in err.combination.items()}))


def test_three_gpus_with_the_tiny_preset_get_a_whole_combination_not_a_circle():
    # The newcomer's case: 32 x 8 samples on 3 ranks. Neither train batch 30/33 nor mini-batch
    # 15/18 alone makes a valid plan; the message offers train batch 24 with mini-batch 24.
    tiny = BatchParams(n_gpus_per_node=3, nnodes=1, sp=1, rollout_n=8, train_batch_size=32,
                       ppo_mini_batch_size=16, ppo_micro_batch_size_per_gpu=64)
    with pytest.raises(BatchPlanError) as info:
        plan_batch(tiny)
    assert info.value.combination == {"data.train_batch_size": 24, "actor_rollout_ref.actor.ppo_mini_batch_size": 24}
    assert str(info.value).endswith(
        "A combination that works: data.train_batch_size=24 actor_rollout_ref.actor.ppo_mini_batch_size=24.")
    plan_batch(replace(tiny, train_batch_size=24, ppo_mini_batch_size=24))
    # Where micro 64 cannot divide the rank's mini-batch, the combination changes it too.
    with pytest.raises(BatchPlanError) as info:
        plan_batch(replace(tiny, ppo_micro_batch_size_per_gpu=48, n_gpus_per_node=5))
    combo = info.value.combination
    assert combo and batch_rules_hold(replace(tiny, n_gpus_per_node=5, ppo_micro_batch_size_per_gpu=48,
                                              **{_field(k): v for k, v in combo.items()}))


def test_a_key_that_alone_fixes_the_plan_gets_no_combination():
    with pytest.raises(BatchPlanError) as info:
        plan_batch(replace(PR_ACTOR, ppo_mini_batch_size=33))
    assert info.value.combination is None


def test_mini_batch_33_on_two_gpus_names_the_key_and_nearby_values():
    with pytest.raises(BatchPlanError) as info:
        plan_batch(replace(PR_ACTOR, ppo_mini_batch_size=33))
    message = str(info.value)
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=33" in message and "dp=2" in message
    assert "ppo_mini_batch_size=32 or 64" in message  # valid with data.train_batch_size=64
    assert "split evenly: 32 or 34" in message
    assert info.value.suggestions == {"actor_rollout_ref.actor.ppo_mini_batch_size": [32, 64]}


def test_train_batch_not_multiple_of_mini_batch_suggests_both_keys():
    with pytest.raises(BatchPlanError) as info:
        plan_batch(replace(PR_ACTOR, ppo_mini_batch_size=24))
    assert info.value.suggestions == {
        "actor_rollout_ref.actor.ppo_mini_batch_size": [16, 32],
        "data.train_batch_size": [48, 72],
    }


def test_deprecated_global_micro_batch_is_divided_by_dp_once():
    plan = plan_batch(replace(PR_ACTOR, ppo_micro_batch_size_per_gpu=None, ppo_micro_batch_size=8))
    assert (plan.micro, plan.gas) == (4, 4)
    with pytest.raises(BatchPlanError, match=r"ppo_micro_batch_size=5 is not divisible by dp=2 .*4 or 8"):
        plan_batch(replace(PR_ACTOR, ppo_micro_batch_size_per_gpu=None, ppo_micro_batch_size=5))
    with pytest.raises(
        BatchPlanError, match="keep only actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
    ):
        plan_batch(replace(PR_ACTOR, ppo_micro_batch_size=8))


def test_missing_micro_batch_size_asks_for_it_or_dynamic_bsz():
    with pytest.raises(BatchPlanError, match="ppo_micro_batch_size_per_gpu is not set.*use_dynamic_bsz=True"):
        plan_batch(replace(PR_ACTOR, ppo_micro_batch_size_per_gpu=None))


def test_sequence_parallel_size_must_divide_world():
    with pytest.raises(
        BatchPlanError, match=r"ulysses_sequence_parallel_size=3 does not divide.*one of \[1, 2, 4\]"
    ):
        plan_batch(replace(PR_ACTOR, n_gpus_per_node=4, sp=3))


def test_data_parallel_size_is_the_one_divide_check():
    """repro's plan and verl's engine (deepspeed.ulysses_sequence_parallel_size) ask the same function."""
    assert data_parallel_size(4, 2, "k") == 2
    with pytest.raises(BatchPlanError, match=r"^deepspeed\.ulysses_sequence_parallel_size=3 does not divide the world "
                                             r"size 4; it must be one of \[1, 2, 4\]$"):
        data_parallel_size(4, 3, "deepspeed.ulysses_sequence_parallel_size")


def test_dynamic_budget_below_longest_sequence_is_refused():
    with pytest.raises(BatchPlanError, match="ppo_max_token_len_per_gpu=1000.*>= 1024"):
        plan_batch(replace(PR_ACTOR, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=1000, max_seq_len=1024))


def test_critic_plan_uses_the_critic_keys():
    cfg = RunConfig()
    cfg.data.train_batch_size = 64
    cfg.critic.ppo_mini_batch_size, cfg.critic.ppo_micro_batch_size_per_gpu = 16, 4
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = 32
    critic, actor = plan_role_batch(cfg, "critic"), plan_role_batch(cfg, "actor")
    assert (critic.per_rank_mini, critic.micro, critic.gas) == (8, 4, 2)
    assert actor.per_rank_mini == 16
    cfg.critic.ppo_micro_batch_size_per_gpu = 3
    with pytest.raises(ValueError, match=r"critic\.ppo_micro_batch_size_per_gpu=3 does not divide"):
        plan_role_batch(cfg, "critic")


# ---- token-budget micro-batches ------------------------------------------------------------------
