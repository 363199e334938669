"""Token-budget (dynamic) micro-batches: ``use_dynamic_bsz`` / ``ppo_max_token_len_per_gpu``.

A rank's mini-batch is cut into micro-batches whose token sums stay within the budget, and every
rank runs as many micro-batches as the rank that needs the most (so every rank issues the same
collectives); the loss is then normalised by the global token count (``repro.batching.plan``'s rules).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def split_micro_batches_by_tokens(
    seq_lens: Sequence[int], max_tokens: int, num_micro_batches: int | None = None
) -> list[list[int]]:
    """Pack sample indices into micro-batches whose token sums stay within ``max_tokens``.

    Deterministic: the fewest bins first-fit decreasing finds, then the loads are balanced
    (longest sequence first into the lightest bin that fits). With ``num_micro_batches`` the
    result has exactly that many non-empty bins (at least the minimum, at most one per sample),
    which is how every dp rank is made to run the same number of micro-batches. Bins are
    ordered by their first index and hold ascending indices; each index appears exactly once.
    A sequence longer than ``max_tokens`` is a ``ValueError`` naming ``ppo_max_token_len_per_gpu``.
    """
    lens = [int(x) for x in seq_lens]
    if max_tokens < 1:
        raise ValueError(f"ppo_max_token_len_per_gpu={max_tokens} must be a positive integer")
    for i, length in enumerate(lens):
        if length < 0:
            raise ValueError(f"sequence {i} has a negative length {length}")
        if length > max_tokens:
            raise ValueError(
                f"sequence {i} has {length} tokens, more than ppo_max_token_len_per_gpu={max_tokens}; "
                f"raise ppo_max_token_len_per_gpu to at least {length} (or to max_prompt_length + max_response_length)"
            )
    if not lens:
        if num_micro_batches not in (None, 0):
            raise ValueError(f"num_micro_batches={num_micro_batches} for an empty batch")
        return []
    order = sorted(range(len(lens)), key=lambda i: (-lens[i], i))
    minimum = len(first_fit(lens, max_tokens, order))
    k = minimum if num_micro_batches is None else int(num_micro_batches)
    if not minimum <= k <= len(lens):
        raise ValueError(
            f"num_micro_batches={k} is not possible for {len(lens)} sequences under "
            f"ppo_max_token_len_per_gpu={max_tokens}: it must be in [{minimum}, {len(lens)}]"
        )
    bins = _balanced(lens, order, max_tokens, k)
    if bins is None:
        bins = _split_to(first_fit(lens, max_tokens, order), lens, k)
    return sorted((sorted(b) for b in bins), key=lambda b: b[0])


def min_micro_batches(seq_lens: Sequence[int], max_tokens: int) -> int:
    """How many micro-batches :func:`split_micro_batches_by_tokens` makes for one rank on its own."""
    return len(split_micro_batches_by_tokens(seq_lens, max_tokens))


def equalize_micro_batch_counts(
    per_rank_seq_lens: Sequence[Sequence[int]], max_tokens: int
) -> list[list[list[int]]]:
    """Token-budget micro-batches for every dp rank, all ranks with the same count.

    Each micro-batch's backward issues gradient collectives (ZeRO-2 reduce-scatter, ZeRO-3
    all-gathers), so a rank that ran fewer micro-batches than its peers would leave them
    blocked in a collective it never joins: the ZeRO-2 hang. Every rank therefore uses the
    largest per-rank minimum. Workers that pack locally do the same with an all-reduce(MAX) of
    :func:`min_micro_batches` and pass the result as ``num_micro_batches``.
    """
    if not per_rank_seq_lens:
        return []
    count = max(min_micro_batches(lens, max_tokens) for lens in per_rank_seq_lens)
    if any(len(lens) < count for lens in per_rank_seq_lens):
        raise ValueError(
            f"a rank has fewer samples than the {count} micro-batches its peers need; "
            "give every dp rank the same number of samples"
        )
    return [split_micro_batches_by_tokens(lens, max_tokens, count) for lens in per_rank_seq_lens]


def first_fit(lengths: Sequence[int], capacity: int | None, order: Iterable[int] | None = None) -> list[list[int]]:
    """Indices per bin: each item, in ``order`` (default: as given), into the first bin with room
    (``capacity`` None: one bin). An item longer than ``capacity`` gets a bin of its own.

    Shared by the token-budget micro-batching here (longest first) and the packing of a
    micro-batch's samples into rows (``repro.workers.packing``, in batch order).
    """
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in range(len(lengths)) if order is None else order:
        n = lengths[i]
        for b, load in enumerate(loads):
            if capacity is None or load + n <= capacity:
                bins[b].append(i)
                loads[b] += n
                break
        else:
            bins.append([i])
            loads.append(n)
    return bins


def _balanced(lens: list[int], order: list[int], cap: int, k: int) -> list[list[int]] | None:
    """Longest first into the least-loaded bin that fits (ties: fewer samples, lower bin); None if
    some sequence fits nowhere or a bin stays empty."""
    bins: list[list[int]] = [[] for _ in range(k)]
    loads = [0] * k
    for i in order:
        fits = [b for b in range(k) if loads[b] + lens[i] <= cap]
        if not fits:
            return None
        b = min(fits, key=lambda b: (loads[b], len(bins[b]), b))
        bins[b].append(i)
        loads[b] += lens[i]
    return bins if all(bins) else None


def _split_to(bins: list[list[int]], lens: list[int], k: int) -> list[list[int]]:
    """Split the fullest multi-sample bins until there are ``k``; splitting never raises a load."""
    bins = [list(b) for b in bins]
    while len(bins) < k:
        b = max(
            (b for b in range(len(bins)) if len(bins[b]) > 1),
            key=lambda b: (sum(lens[i] for i in bins[b]), -b),
        )
        bins.append([bins[b].pop()])
    return bins
