"""Batch semantics of a training role: how one RL step's samples become DeepSpeed micro-batches.

The rules (docs/config.md, "Batch semantics"):

- ``world = n_gpus_per_node * nnodes`` and ``dp = world / sp``.
- One step has ``data.train_batch_size * rollout.n`` samples; a mini-batch has
  ``ppo_mini_batch_size * rollout.n`` samples. Both are split across the ``dp`` groups exactly
  once: a rank's mini-batch is ``mini_batch_samples // dp`` and is never divided by ``dp`` again.
- ``GAS = per_rank_mini / ppo_micro_batch_size_per_gpu``; the plan's ``train_batch_size`` is
  ``micro * GAS * dp * sp`` (the seed's arithmetic: every rank counted, SP ranks included). DeepSpeed
  itself is given ``micro * GAS * dp`` when ``sp > 1`` (``repro.config.ds_config``): with repro's SP
  mpu its batch check counts data-parallel ranks only, and an SP group's ranks share its samples.
- With dynamic (token-budget) micro-batches the sample-count micro-batch and GAS are nominal
  (1 and 1): the worker marks the accumulation boundary itself and normalises the loss by the
  real token or micro-batch count.

A config that cannot be split raises :class:`BatchPlanError` (a ``ValueError``) naming the
keys involved and, for the key to change, the nearest values that make the whole plan valid.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from repro.batching.suggest import nearest_combination

ROLE_PREFIXES = {"actor": "actor_rollout_ref.actor", "critic": "critic"}
K_NGPUS = "trainer.n_gpus_per_node"
K_NNODES = "trainer.nnodes"
K_TBS = "data.train_batch_size"
K_N = "actor_rollout_ref.rollout.n"


@dataclass(frozen=True)
class RoleBatchPlan:
    """How one role (actor or critic) splits a step's samples; see the module docstring."""

    world: int
    dp: int
    sp: int
    samples_per_step: int
    """data.train_batch_size * rollout.n."""
    mini_batch_samples: int
    """ppo_mini_batch_size * rollout.n, over all dp ranks."""
    per_rank_mini: int
    """mini_batch_samples // dp: what one rank trains per optimizer step."""
    micro: int
    """Samples per micro-batch on a rank (1, nominal, when dynamic)."""
    gas: int
    """Gradient-accumulation steps per mini-batch (1, nominal, when dynamic)."""
    train_batch_size: int
    """micro * gas * dp * sp (every rank counted); DeepSpeed's own is this / sp (``repro.config.ds_config``)."""
    num_mini_batches: int
    """Optimizer steps per RL step and epoch."""
    dynamic: bool
    max_token_len: int | None
    """Token budget of one dynamic micro-batch (ppo_max_token_len_per_gpu * sp); None when static."""


class BatchPlanError(ValueError):
    """A batch configuration that cannot be split; ``keys`` are the config keys involved and
    ``suggestions`` maps the key(s) to change to the nearest values that make the plan valid."""

    def __init__(self, message: str, keys: Sequence[str], suggestions: dict[str, list[int]]) -> None:
        super().__init__(message)
        self.keys = tuple(keys)
        self.suggestions = suggestions
        self.combination: dict[str, int] | None = None
        """Keys and values of a whole valid plan, when no one key alone fixes this one."""


@dataclass(frozen=True)
class BatchParams:
    """The inputs of a plan, as plain numbers (``plan_batch``'s arguments)."""

    n_gpus_per_node: int
    nnodes: int
    sp: int
    rollout_n: int
    train_batch_size: int
    ppo_mini_batch_size: int
    ppo_micro_batch_size_per_gpu: int | None
    ppo_micro_batch_size: int | None = None
    use_dynamic_bsz: bool = False
    ppo_max_token_len_per_gpu: int | None = None
    max_seq_len: int | None = None
    """Longest possible sequence (max_prompt_length + max_response_length); checked against the token budget."""
    prefix: str = "actor_rollout_ref.actor"
    """Config path of the role's section, used in messages."""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def data_parallel_size(world: int, sp: int, key: str, world_from: str = "") -> int:
    """``dp = world / sp``: the one check that a sequence-parallel size divides the world (repro's
    batch plan and verl's engine both ask); :class:`BatchPlanError` naming ``key`` and the divisors
    otherwise. ``world_from`` says where the world size comes from, in the message."""
    if world % sp:
        raise BatchPlanError(f"{key}={sp} does not divide the world size {world}{world_from}; it must be one of "
                             f"{_divisors(world)}", [key], {})
    return world // sp


def plan_batch(p: BatchParams) -> RoleBatchPlan:
    """Validate ``p`` and derive the plan; raises :class:`BatchPlanError` naming keys and fixes."""
    return _plan(p, suggest=True)


def _plan(p: BatchParams, suggest: bool) -> RoleBatchPlan:
    k_sp = f"{p.prefix}.ulysses_sequence_parallel_size"
    k_mini = f"{p.prefix}.ppo_mini_batch_size"
    k_micro = f"{p.prefix}.ppo_micro_batch_size_per_gpu"
    k_gmicro = f"{p.prefix}.ppo_micro_batch_size"
    k_tokens = f"{p.prefix}.ppo_max_token_len_per_gpu"
    n, tbs, mini = p.rollout_n, p.train_batch_size, p.ppo_mini_batch_size
    for key, value in (
        (K_NGPUS, p.n_gpus_per_node),
        (K_NNODES, p.nnodes),
        (k_sp, p.sp),
        (K_N, n),
        (K_TBS, tbs),
        (k_mini, mini),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BatchPlanError(f"{key}={value!r} must be a positive integer", [key], {})

    world = p.n_gpus_per_node * p.nnodes
    try:
        dp = data_parallel_size(world, p.sp, k_sp, f" ({K_NGPUS}={p.n_gpus_per_node} x {K_NNODES}={p.nnodes})")
    except BatchPlanError as err:
        keys = [k_sp, K_NGPUS, K_NNODES]
        if not suggest:
            raise BatchPlanError(str(err), keys, {}) from None
        valid = [d for d in _divisors(world) if _is_valid(replace(p, sp=d))]
        more = f". Valid values with the other keys as they are: {valid}" if valid else (
            ", but none of those passes the other rules")
        raise BatchPlanError(str(err) + more, keys, {k_sp: valid}) from None
    dp_words = (
        f"dp={dp} data-parallel ranks ({K_NGPUS}={p.n_gpus_per_node} x {K_NNODES}={p.nnodes} = world {world}, "
        f"divided by {k_sp}={p.sp})"
    )
    samples = tbs * n
    if samples % dp:
        _fail(
            p,
            f"{K_TBS}={tbs} x {K_N}={n} = {samples} samples per step cannot be split evenly "
            f"across {dp_words}",
            [K_TBS, K_N, K_NGPUS, K_NNODES],
            "train_batch_size",
            K_TBS,
            suggest=suggest,
            split_ok=lambda v: (v * n) % dp == 0,
        )
    mini_samples = mini * n
    if mini_samples % dp:
        _fail(
            p,
            f"{k_mini}={mini} x {K_N}={n} = {mini_samples} samples per mini-batch cannot be split "
            f"evenly across {dp_words}",
            [k_mini, K_N, K_NGPUS, K_NNODES],
            "ppo_mini_batch_size",
            k_mini,
            suggest=suggest,
            split_ok=lambda v: (v * n) % dp == 0,
        )
    if tbs % mini:
        _fail(
            p,
            f"{K_TBS}={tbs} is not a multiple of {k_mini}={mini}, so a step would end with a "
            "partial mini-batch",
            [K_TBS, k_mini],
            "ppo_mini_batch_size",
            k_mini,
            suggest=suggest,
            also=("train_batch_size", K_TBS),
        )
    per_rank_mini = mini_samples // dp

    if p.use_dynamic_bsz:
        budget = p.ppo_max_token_len_per_gpu
        if not isinstance(budget, int) or budget < 1:
            raise BatchPlanError(
                f"{k_tokens}={budget!r} must be a positive integer with {p.prefix}.use_dynamic_bsz=True",
                [k_tokens],
                {},
            )
        if p.max_seq_len is not None and budget * p.sp < p.max_seq_len:
            need = -(-p.max_seq_len // p.sp)
            raise BatchPlanError(
                f"{k_tokens}={budget} (x sp {p.sp}) is below the longest possible sequence, "
                f"data.max_prompt_length + data.max_response_length = {p.max_seq_len} tokens; a "
                f"sequence must fit in one micro-batch: set {k_tokens} >= {need}",
                [k_tokens, "data.max_prompt_length", "data.max_response_length"],
                {k_tokens: [need]},
            )
        micro, gas, max_token_len = 1, 1, budget * p.sp
    else:
        micro = _static_micro(p, dp, dp_words, per_rank_mini, k_micro, k_gmicro, suggest)
        if per_rank_mini % micro:
            legacy = p.ppo_micro_batch_size is not None
            named = (
                f"{k_gmicro}={p.ppo_micro_batch_size} / dp={dp} = {micro}" if legacy else f"{k_micro}={micro}"
            )
            key = k_gmicro if legacy else k_micro
            _fail(
                p,
                f"{named} does not divide the per-rank mini-batch of {per_rank_mini} samples "
                f"({k_mini}={mini} x {K_N}={n} / dp={dp}), so gradient accumulation would drop samples",
                [key, k_mini, K_N],
                "gmicro" if legacy else "micro",
                key,
                suggest=suggest,
                also=("ppo_mini_batch_size", k_mini),
            )
        gas, max_token_len = per_rank_mini // micro, None

    return RoleBatchPlan(
        world=world,
        dp=dp,
        sp=p.sp,
        samples_per_step=samples,
        mini_batch_samples=mini_samples,
        per_rank_mini=per_rank_mini,
        micro=micro,
        gas=gas,
        train_batch_size=micro * gas * dp * p.sp,
        num_mini_batches=samples // mini_samples,
        dynamic=p.use_dynamic_bsz,
        max_token_len=max_token_len,
    )


def _static_micro(
    p: BatchParams, dp: int, dp_words: str, per_rank_mini: int, k_micro: str, k_gmicro: str, suggest: bool
) -> int:
    """The per-rank micro-batch from the per-gpu key or the deprecated global one (divided by dp once)."""
    if p.ppo_micro_batch_size is not None and p.ppo_micro_batch_size_per_gpu is not None:
        raise BatchPlanError(
            f"both {k_micro}={p.ppo_micro_batch_size_per_gpu} and the deprecated {k_gmicro}="
            f"{p.ppo_micro_batch_size} are set; keep only {k_micro}",
            [k_micro, k_gmicro],
            {},
        )
    if p.ppo_micro_batch_size is not None:
        if p.ppo_micro_batch_size % dp:
            _fail(
                p,
                f"the deprecated global {k_gmicro}={p.ppo_micro_batch_size} is not divisible by {dp_words} "
                f"(it is divided across the data-parallel ranks); prefer {k_micro}",
                [k_gmicro, K_NGPUS, K_NNODES],
                "gmicro",
                k_gmicro,
                suggest=suggest,
                split_ok=lambda v: v % dp == 0,
            )
        return p.ppo_micro_batch_size // dp
    if p.ppo_micro_batch_size_per_gpu is None:
        raise BatchPlanError(
            f"{k_micro} is not set; set it (a divisor of the per-rank mini-batch, "
            f"{per_rank_mini}) or set {p.prefix}.use_dynamic_bsz=True",
            [k_micro, f"{p.prefix}.use_dynamic_bsz"],
            {},
        )
    if not isinstance(p.ppo_micro_batch_size_per_gpu, int) or p.ppo_micro_batch_size_per_gpu < 1:
        raise BatchPlanError(
            f"{k_micro}={p.ppo_micro_batch_size_per_gpu!r} must be a positive integer", [k_micro], {}
        )
    return p.ppo_micro_batch_size_per_gpu


# Which BatchParams field each suggestion varies, and its search range given the params.
def _field_and_range(p: BatchParams, what: str) -> tuple[str, int, int]:
    if what == "train_batch_size":
        return "train_batch_size", 1, 4 * p.train_batch_size + 4 * p.ppo_mini_batch_size
    if what == "ppo_mini_batch_size":
        return "ppo_mini_batch_size", 1, max(p.train_batch_size, p.ppo_mini_batch_size + 1)
    if what == "micro":
        # A per-rank micro-batch never exceeds the (global) mini-batch in samples.
        return "ppo_micro_batch_size_per_gpu", 1, max(p.ppo_mini_batch_size * p.rollout_n, 2)
    if what == "gmicro":
        return (
            "ppo_micro_batch_size",
            1,
            max(p.ppo_mini_batch_size * p.rollout_n, (p.ppo_micro_batch_size or 1) + 1),
        )
    raise AssertionError(what)


def _nearest(value: int, ok: Callable[[int], bool], lo: int, hi: int) -> list[int]:
    """The nearest value below and the nearest above ``value`` (within [lo, hi]) that satisfy ``ok``."""
    below = next((v for v in range(min(value - 1, hi), lo - 1, -1) if ok(v)), None)
    above = next((v for v in range(max(value + 1, lo), hi + 1) if ok(v)), None)
    return [v for v in (below, above) if v is not None]


def _is_valid(p: BatchParams) -> bool:
    try:
        _plan(p, suggest=False)
    except BatchPlanError:
        return False
    return True


def _fail(
    p: BatchParams,
    problem: str,
    keys: list[str],
    what: str,
    key: str,
    *,
    suggest: bool,
    split_ok: Callable[[int], bool] | None = None,
    also: tuple[str, str] | None = None,
) -> None:
    """Raise the error for ``problem`` with the nearest values of ``key`` that make the whole plan valid."""
    if not suggest:  # a probe from _is_valid: only validity matters
        raise BatchPlanError(problem, keys, {})
    suggestions: dict[str, list[int]] = {}
    parts = [problem + "."]
    for field_what, field_key in ((what, key), *((also,) if also else ())):
        name, lo, hi = _field_and_range(p, field_what)
        current = getattr(p, name)
        valid = _nearest(current, lambda v, name=name: _is_valid(replace(p, **{name: v})), lo, hi)
        suggestions[field_key] = valid
        lead = "Nearest valid values:" if len(parts) == 1 else "Or:"
        if valid:
            parts.append(f"{lead} {field_key}={' or '.join(map(str, valid))}.")
        else:
            parts.append(f"No value of {field_key} alone fixes this; change another key.")
        if split_ok is not None and field_key == key:
            split = _nearest(current, split_ok, lo, hi)
            if split and split != valid:
                parts[-1] = parts[-1][:-1] + (
                    f" (nearest that split evenly: {' or '.join(map(str, split))}, "
                    "but not all of those pass the other rules)."
                )
    combination = None
    if not all(suggestions.values()):
        # One key alone cannot fix it: following one key's advice only moves the error to the next key.
        changed = nearest_combination(p, _is_valid, p.n_gpus_per_node * p.nnodes // p.sp)
        if changed:
            combination = {_key(p, name): value for name, value in changed.items()}
            parts.append("A combination that works: "
                         + " ".join(f"{k}={v}" for k, v in combination.items()) + ".")
    error = BatchPlanError(" ".join(parts), keys, suggestions)
    error.combination = combination
    raise error


def _key(p: BatchParams, name: str) -> str:
    return K_TBS if name == "train_batch_size" else f"{p.prefix}.{name}"


def sample_layout(plan: RoleBatchPlan) -> list[list[list[range]]]:
    """Global sample indices of each ``[mini-batch][dp rank][micro-batch]`` for a static plan.

    The driver hands dp rank ``r`` the contiguous shard ``[r * S/dp, (r+1) * S/dp)`` of a step's
    ``S`` samples; the rank cuts its shard into mini-batches of ``per_rank_mini`` and those into
    ``gas`` micro-batches. SP ranks of one dp group share their group's samples.
    """
    assert not plan.dynamic, "dynamic plans pack micro-batches by tokens (split_micro_batches_by_tokens)"
    shard = plan.samples_per_step // plan.dp
    return [
        [
            [
                range(start, start + plan.micro)
                for start in range(
                    r * shard + m * plan.per_rank_mini, r * shard + (m + 1) * plan.per_rank_mini, plan.micro
                )
            ]
            for r in range(plan.dp)
        ]
        for m in range(plan.num_mini_batches)
    ]
