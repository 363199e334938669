"""Align per-rank call sequences and find the first divergence.

Per process group, each member's collectives are aligned against the group's lowest rank with
an edit distance: equal fingerprints cost 0 (0.01 when the call sites differ, which makes the
aligner pair calls from the same line), a changed call 1 (1.5 when the op differs), a call
present on one rank only 1. So an extra or missing call is one gap - "rank 0 issued one extra
all_reduce" - instead of a cascade of shifted mismatches. Long agreeing prefixes are skipped
linearly; the quadratic alignment only runs on a window after the first disagreement.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from repro.collectives.events import CallRecord, RankTrace

WINDOW = 200
_GAP = 1.0


@dataclass
class Divergence:
    """The first point where two ranks of a group disagree.

    kinds: ``mismatch`` (both issued a call, they differ in ``differing``), ``extra`` (``rank_a``
    issued ``extra_calls`` that ``rank_b`` did not, and then they agree again), ``stopped``
    (``rank_b``'s record ends before ``call_a``; ``last_b`` is its last recorded call) and
    ``timeout`` (live check: ``rank_b`` did not reach ``call_a`` in time).
    """

    kind: str
    group: str
    ranks: tuple[int, ...]
    rank_a: int
    rank_b: int
    call_a: CallRecord | None
    call_b: CallRecord | None = None
    differing: list[str] = field(default_factory=list)
    extra_calls: list[CallRecord] = field(default_factory=list)
    last_b: CallRecord | None = None
    missing_ranks: list[int] = field(default_factory=list)
    before: list[tuple[CallRecord, CallRecord | None]] = field(default_factory=list)
    source: str = "trace"
    parted: dict | None = None
    """Where the ranks' paths first parted before the divergence: the first call of the group
    that both issued alike but from different user stacks (``seq``, ``call``: its short text,
    ``stacks``: rank -> stack, innermost first). An extra forward through a helper issues the
    same collectives as the next step's forward; only the stacks tell where it came from."""


def _pair_cost(x: CallRecord, y: CallRecord) -> float:
    if x.fingerprint() == y.fingerprint():
        return 0.0 if x.site == y.site else 0.01
    return 1.0 if x.op == y.op else 1.5


def _align_window(a: list[CallRecord], b: list[CallRecord]) -> list[tuple[int | None, int | None]]:
    """Optimal alignment of two short sequences as (index in a or None, index in b or None) pairs."""
    n, m = len(a), len(b)
    # cost[i][j]: cheapest alignment of a[i:] with b[j:], filled from the end so we can walk forward.
    cost = [[0.0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        cost[i][m] = cost[i + 1][m] + _GAP
    for j in range(m - 1, -1, -1):
        cost[n][j] = cost[n][j + 1] + _GAP
    for i in range(n - 1, -1, -1):
        row, below = cost[i], cost[i + 1]
        for j in range(m - 1, -1, -1):
            row[j] = min(below[j + 1] + _pair_cost(a[i], b[j]), below[j] + _GAP, row[j + 1] + _GAP)
    out: list[tuple[int | None, int | None]] = []
    i = j = 0
    while i < n or j < m:
        here = cost[i][j]
        if i < n and j < m and abs(cost[i + 1][j + 1] + _pair_cost(a[i], b[j]) - here) < 1e-9:
            out.append((i, j))
            i, j = i + 1, j + 1
        elif i < n and abs(cost[i + 1][j] + _GAP - here) < 1e-9:
            out.append((i, None))
            i += 1
        else:
            out.append((None, j))
            j += 1
    return out


def _context(a: list[CallRecord], b: list[CallRecord], pairs: list[tuple[int, int]], n: int) -> list:
    return [(a[i], b[j]) for i, j in pairs[-n:]]


def align_pair(
    a: list[CallRecord],
    b: list[CallRecord],
    rank_a: int,
    rank_b: int,
    last_a: CallRecord | None = None,
    last_b: CallRecord | None = None,
    context: int = 3,
) -> Divergence | None:
    """First divergence between two ranks' collectives on one group (``a`` is the reference)."""
    matched: list[tuple[int, int]] = []
    i = j = 0
    while True:
        # Linear scan while both agree exactly (fingerprint and call site).
        while (
            i < len(a) and j < len(b) and a[i].fingerprint() == b[j].fingerprint() and a[i].site == b[j].site
        ):
            matched.append((i, j))
            i, j = i + 1, j + 1
        if i == len(a) and j == len(b):
            return None
        steps = _align_window(a[i : i + WINDOW], b[j : j + WINDOW])
        for k, (x, y) in enumerate(steps):
            if x is not None and y is not None:
                if a[i + x].fingerprint() == b[j + y].fingerprint():
                    matched.append((i + x, j + y))
                    continue
                ca, cb = a[i + x], b[j + y]
                return Divergence(
                    kind="mismatch",
                    group=ca.group,
                    ranks=ca.ranks,
                    rank_a=rank_a,
                    rank_b=rank_b,
                    call_a=ca,
                    call_b=cb,
                    differing=ca.differing_fields(cb),
                    before=_context(a, b, matched, context),
                )
            # A run of calls present on one side only: that side issued extra calls, or the
            # other side's record ends (it stopped, crashed or hangs elsewhere).
            on_a = x is not None
            extra: list[CallRecord] = []
            for sx, sy in steps[k:]:
                if on_a and sx is not None and sy is None:
                    extra.append(a[i + sx])
                elif not on_a and sy is not None and sx is None:
                    extra.append(b[j + sy])
                else:
                    break
            resumes = any(sx is not None and sy is not None for sx, sy in steps[k + len(extra) :])
            here, there = (rank_a, rank_b) if on_a else (rank_b, rank_a)
            return Divergence(
                kind="extra" if resumes else "stopped",
                group=extra[0].group,
                ranks=extra[0].ranks,
                rank_a=here,
                rank_b=there,
                call_a=extra[0],
                extra_calls=extra,
                last_b=None if resumes else (last_b if on_a else last_a),
                before=_context(a, b, matched, context),
            )
        i = min(len(a), i + WINDOW)
        j = min(len(b), j + WINDOW)


def first_divergence(traces: dict[int, RankTrace], context: int = 3) -> Divergence | None:
    """Earliest divergence (by wall time of the divergent call) over all groups and rank pairs."""
    groups: dict[str, tuple[int, ...]] = {}
    for t in traces.values():
        groups.update(t.groups)
        for c in t.calls:
            if c.group_seq is not None:
                groups.setdefault(c.group, c.ranks)
    found: list[Divergence] = []
    for key, ranks in groups.items():
        members = [r for r in sorted(ranks) if r in traces]
        if len(members) < 2:
            continue
        ref = members[0]
        seq_ref = traces[ref].collectives(key)
        for other in members[1:]:
            seq_other = traces[other].collectives(key)
            d = align_pair(
                seq_ref,
                seq_other,
                ref,
                other,
                last_a=traces[ref].last_call,
                last_b=traces[other].last_call,
                context=context,
            )
            if d is not None:
                found.append(d)
    if not found:
        return None
    return min(found, key=lambda d: d.call_a.t if d.call_a else float("inf"))


def _function(site: str) -> tuple[str, str]:
    """``(file, function)`` of a ``path:line function`` site."""
    path, _, rest = site.rpartition(":")
    return path, rest.partition(" ")[2]


def _root_and_peer(x: CallRecord, y: CallRecord) -> bool:
    """A rooted collective that its root issued from one line and a non-root rank from another line of
    the same function: the usual ``if rank == root: send else: receive`` shape (vLLM's
    ``in_the_same_node_as`` broadcasts so on every job), which a note would flag on every run."""
    return x.root is not None and (x.rank == x.root) != (y.rank == y.root) and _function(x.site) == _function(y.site)


def first_site_difference(traces: dict[int, RankTrace]) -> str | None:
    """A note, not a divergence: the first agreeing collective that two ranks issued from different lines.

    Legitimate in rank-dependent code, but worth a look when a job misbehaves without diverging. A root
    and a non-root rank in two branches of one function are not noted (:func:`_root_and_peer`).
    """
    by_group: dict[str, dict[int, list[CallRecord]]] = {}
    for r, t in traces.items():
        for c in t.calls:
            if c.group_seq is not None:
                by_group.setdefault(c.group, {}).setdefault(r, []).append(c)
    for group, seqs in by_group.items():
        ranks = sorted(seqs)
        for other in ranks[1:]:
            for x, y in zip(seqs[ranks[0]], seqs[other], strict=False):
                if x.fingerprint() == y.fingerprint() and x.site != y.site and not _root_and_peer(x, y):
                    return (
                        f"Note: call #{x.group_seq} on group {group} ({x.short()}) came from {x.site} on rank "
                        f"{ranks[0]} but from {y.site} on rank {other}"
                    )
    return None


def parted(traces: dict[int, RankTrace], div: Divergence) -> dict | None:
    """The first call before ``div`` on its group that ``rank_a`` and ``rank_b`` issued alike from different stacks."""
    a, b = traces.get(div.rank_a), traces.get(div.rank_b)
    if a is None or b is None or div.call_a is None or div.call_a.group_seq is None:
        return None
    for x, y in zip(a.collectives(div.group), b.collectives(div.group), strict=False):
        if x.group_seq >= div.call_a.group_seq:
            break
        if x.fingerprint() == y.fingerprint() and x.stack != y.stack:
            return {"seq": x.group_seq, "call": x.short(), "stacks": {div.rank_a: x.stack, div.rank_b: y.stack}}
    return None
