"""Shared hypothesis strategies. Each helper appends its own section; keep sections independent."""

from __future__ import annotations

import math

from hypothesis import strategies as st

# ---- batch semantics (repro.batching.plan) ------------------------------------------------------------


def batch_rules_hold(p) -> bool:
    """The batch rules of docs/config.md ("Batch semantics") written out directly.

    The oracle for ``repro.batching.plan.plan_batch``.
    """
    world = p.n_gpus_per_node * p.nnodes
    if world % p.sp:
        return False
    dp = world // p.sp
    n = p.rollout_n
    if (
        (p.train_batch_size * n) % dp
        or (p.ppo_mini_batch_size * n) % dp
        or p.train_batch_size % p.ppo_mini_batch_size
    ):
        return False
    if p.use_dynamic_bsz:
        return p.max_seq_len is None or p.ppo_max_token_len_per_gpu * p.sp >= p.max_seq_len
    if p.ppo_micro_batch_size is not None:
        if p.ppo_micro_batch_size_per_gpu is not None or p.ppo_micro_batch_size % dp:
            return False
        micro = p.ppo_micro_batch_size // dp
    else:
        micro = p.ppo_micro_batch_size_per_gpu
    return micro is not None and micro >= 1 and ((p.ppo_mini_batch_size * n) // dp) % micro == 0


@st.composite
def valid_batch_params(draw, dynamic: bool | None = None):
    """BatchParams that satisfy every rule: built from world, sp | world, micro, GAS and mini-batch count."""
    from repro.batching.plan import BatchParams

    n_gpus = draw(st.integers(1, 8))
    nnodes = draw(st.integers(1, 3))
    world = n_gpus * nnodes
    sp = draw(st.sampled_from([d for d in range(1, world + 1) if world % d == 0]))
    dp = world // sp
    n = draw(st.integers(1, 8))
    micro = draw(st.integers(1, 8))
    gas = draw(st.integers(1, 8))
    # mini * n must be dp * micro * gas * t for an integer mini: t is a multiple of n / gcd(n, dp*micro*gas).
    step = n // math.gcd(n, dp * micro * gas)
    t = step * draw(st.integers(1, 3))
    mini = dp * micro * gas * t // n
    num_mini = draw(st.integers(1, 4))
    use_dynamic = draw(st.booleans()) if dynamic is None else dynamic
    max_seq_len = draw(st.integers(1, 4096))
    budget = draw(st.integers(-(-max_seq_len // sp), 4 * max_seq_len))
    legacy = not use_dynamic and draw(st.booleans())
    return BatchParams(
        n_gpus_per_node=n_gpus,
        nnodes=nnodes,
        sp=sp,
        rollout_n=n,
        train_batch_size=mini * num_mini,
        ppo_mini_batch_size=mini,
        ppo_micro_batch_size_per_gpu=None if legacy else micro,
        ppo_micro_batch_size=micro * dp if legacy else None,
        use_dynamic_bsz=use_dynamic,
        ppo_max_token_len_per_gpu=budget,
        max_seq_len=max_seq_len,
        prefix=draw(st.sampled_from(["actor_rollout_ref.actor", "critic"])),
    )


@st.composite
def any_batch_params(draw):
    """BatchParams with small random values, valid or not (check with ``batch_rules_hold``)."""
    from repro.batching.plan import BatchParams

    dynamic = draw(st.booleans())
    legacy = not dynamic and draw(st.integers(0, 4)) == 0
    micro = draw(st.integers(1, 16))
    max_seq_len = draw(st.integers(1, 2048))
    return BatchParams(
        n_gpus_per_node=draw(st.integers(1, 8)),
        nnodes=draw(st.integers(1, 2)),
        sp=draw(st.integers(1, 4)),
        rollout_n=draw(st.integers(1, 8)),
        train_batch_size=draw(st.integers(1, 128)),
        ppo_mini_batch_size=draw(st.integers(1, 64)),
        ppo_micro_batch_size_per_gpu=None if legacy else micro,
        ppo_micro_batch_size=micro if legacy else None,
        use_dynamic_bsz=dynamic,
        ppo_max_token_len_per_gpu=draw(st.integers(1, 4096)),
        max_seq_len=max_seq_len,
    )


def token_lengths(max_len: int = 512, max_size: int = 64):
    """Per-sample token counts of one rank's batch (zero allowed: a fully masked sample)."""
    return st.lists(st.integers(0, max_len), min_size=0, max_size=max_size)


# ---- worker batch splits (tests/distributed/workers) ---------------------------------------------


@st.composite
def worker_batch_splits(draw, dp: int) -> dict:
    """One valid way to split an RL step for the DeepSpeed workers on ``dp`` ranks.

    Varies rollout.n, the mini-batch (and so the number of mini-batches per step), fixed or
    token-budget micro-batches, every loss aggregation, the ZeRO stage and the batch's lengths.
    """
    from repro.rl.algorithms import LOSS_AGG_MODES
    n = draw(st.sampled_from([1, 2, 3]))
    mini = draw(st.sampled_from([m for m in (1, 2, 4) if (m * n) % dp == 0]))
    per_step = draw(st.integers(1, 2))
    per_rank_mini = mini * n // dp
    dynamic = draw(st.booleans())
    micro = (
        None
        if dynamic
        else draw(st.sampled_from([d for d in range(1, per_rank_mini + 1) if per_rank_mini % d == 0]))
    )
    return {
        "n": n,
        "mini": mini,
        "train_batch_size": mini * per_step,
        "micro": micro,
        "dynamic": dynamic,
        "max_tokens": draw(st.integers(12, 30)),
        "loss_agg_mode": draw(st.sampled_from(LOSS_AGG_MODES)),
        "stage": draw(st.sampled_from([1, 2, 3])),
        "seed": draw(st.integers(0, 10_000)),
    }


# ---- GSM8K answers and responses (repro.rewards.gsm8k, repro.data) -------------------------------


def gsm8k_numbers():
    """Final answers as GSM8K writes them: optional minus sign, digits, maybe a decimal part."""
    return st.builds(
        lambda neg, whole, frac: ("-" if neg else "") + str(whole) + (f".{frac}" if frac is not None else ""),
        st.booleans(),
        st.integers(0, 10**9),
        st.none() | st.integers(1, 99),
    )


def response_prefix(max_size: int = 600):
    """Free text a model may write before its final answer (any characters, digits included)."""
    return st.text(max_size=max_size)


def digit_free_text(min_size: int = 0, max_size: int = 600):
    """Text with no digits, '.', ',' or '#': contributes no candidate answer."""
    return st.text(
        alphabet=st.characters(blacklist_categories=("Nd", "Cs"), blacklist_characters=".,#"),
        min_size=min_size,
        max_size=max_size,
    )
