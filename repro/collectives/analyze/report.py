"""Divergence reports: plain text for people, JSON for tools.

The text leads with one sentence ("rank 0 issued one extra all_reduce ..."), then shows the two
ranks' calls side by side (op, numel, dtype, call site, library site, sequence number) and the
few calls before the divergence, which all ranks agreed on.
"""

from __future__ import annotations

import re
from typing import Any

from repro.collectives.analyze.align import Divergence
from repro.collectives.events import CallRecord

_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}


def _count(n: int, noun: str) -> str:
    word = _WORDS.get(n, str(n))
    return f"{word} extra {noun}" if n == 1 else f"{word} extra calls"


def _where(c: CallRecord | None) -> str:
    if c is None:
        return "(none recorded)"
    lib = f" [library: {c.lib_site}]" if c.lib_site else ""
    return f"{c.short()} at {c.site}{lib}"


def _last(c: CallRecord | None) -> str:
    if c is None:
        return "no call"
    if c.group_seq is None:
        return f"{c.short()} at {c.site}"
    return f"{c.op} #{c.group_seq}"


def headline(d: Divergence) -> str:
    """The one-sentence finding."""
    grp = f"group {d.group} (global ranks {list(d.ranks)})"
    a = d.call_a
    if d.kind == "mismatch":
        b = d.call_b
        fields = ", ".join(d.differing) or "fingerprint"
        if a.group_seq is None and a.pairs:
            role, peer, seq = a.pairs[0][:3]
            src, dst = (a.rank, peer) if role == "send" else (peer, a.rank)
            return (
                f"Point-to-point mismatch on transfer #{seq} from rank {src} to rank {dst}: rank {d.rank_a} "
                f"posted {a.short()} while rank {d.rank_b} posted {b.short()} (they differ in {fields})"
            )
        if a.group == b.group:
            return (
                f"Collective mismatch on {grp} at call #{a.group_seq}: rank {d.rank_a} issued {a.short()} "
                f"while rank {d.rank_b} issued {b.short()} (they differ in {fields})"
            )
        return (
            f"Crossed collectives: rank {d.rank_a} issued {a.short()} (call #{a.group_seq} on group {a.group}) "
            f"while rank {d.rank_b} issued {b.short()} (call #{b.group_seq} on group {b.group}); "
            f"each waits for the other (they differ in {fields})"
        )
    if d.kind == "extra":
        names = sorted({c.op for c in d.extra_calls})
        noun = names[0] if len(names) == 1 else "/".join(names)
        return (
            f"Rank {d.rank_a} issued {_count(len(d.extra_calls), noun)} on {grp} that rank {d.rank_b} "
            f"did not (rank {d.rank_a}'s call #{a.group_seq}); the ranks agree again after it"
        )
    if d.kind == "stopped":
        last = d.last_b
        state = ""
        if last is not None:
            state = "; that call never returned" if last.t_end is None else ""
        return (
            f"Rank {d.rank_b} never issued {a.op} (rank {d.rank_a}'s call #{a.group_seq} on {grp}); "
            f"rank {d.rank_b}'s record ends with {_last(last)}{state}{_one_call_ahead(d)}"
        )
    if d.kind == "timeout":
        who = ", ".join(str(r) for r in (d.missing_ranks or [d.rank_b]))
        last = d.last_b
        return (
            f"Rank {who} did not reach {a.op} (call #{a.group_seq} on {grp}) that rank {d.rank_a} is waiting in; "
            f"rank {d.rank_b}'s last checked call: {last.op + ' #' + str(last.group_seq) + ' on group ' + last.group if last else 'none'}"
        )
    if d.kind == "deadlock":
        b = d.call_b
        return (
            f"Deadlock: rank {d.rank_a} waits in {a.short()} at {a.site} for rank {d.rank_b}, which waits in "
            f"{b.short()} at {b.site} for an op rank {d.rank_a} has not issued; neither can go on"
        )
    if d.kind == "missing":
        who = ", ".join(str(r) for r in d.missing_ranks)
        return (
            f"Rank {who} left no record although rank {d.rank_a} issued {a.short()} with it "
            f"(at {a.site}): it failed or never started tracing before its first traced call"
        )
    if d.kind == "unreceived":
        seq, took = a.pairs[0][2], d.last_b
        last = (
            f"its last receive from rank {d.rank_a} was #{took.pairs[0][2]} ({took.short()} at {took.site})"
            if took is not None and took.pairs and took.pairs[0][1] == d.rank_a
            else f"it received nothing from rank {d.rank_a}"
        )
        where = f"it waits in {d.call_b.short()} at {d.call_b.site}" if d.call_b else "its record ends"
        return (
            f"Rank {d.rank_a}'s send #{seq} to rank {d.rank_b} ({a.short()} at {a.site}) was never received "
            f"by rank {d.rank_b}: {last}; {where}"
        )
    if d.kind == "hang":
        b = d.call_b
        tail = (
            f"rank {d.rank_b} is blocked in {b.short()} at {b.site}"
            if b is not None
            else f"rank {d.rank_b}'s record ends with {d.last_b.short() if d.last_b else 'no call'}"
        )
        return f"Rank {d.rank_a}'s {a.short()} at {a.site} never returned; {tail}"
    raise AssertionError(f"unknown divergence kind {d.kind}")


def _one_call_ahead(d: Divergence) -> str:
    """What the records of a job stopped from outside look like, said where they look exactly so.

    A time limit or a kill ends the ranks wherever they are: one rank already waits in the next
    collective while its peer, whose last call returned, has not reached it yet. The records alone
    cannot tell that from a peer that never comes (a hang ends the same way once someone stops it),
    so the report names both readings and what tells them apart: whether the job was stopped.
    """
    a, last = d.call_a, d.last_b
    if (len(d.extra_calls) != 1 or a is None or a.t_end is not None or last is None or last.t_end is None
            or last.group != a.group or last.group_seq is None or a.group_seq != last.group_seq + 1):
        return ""
    return (
        f". Rank {d.rank_a} is one call ahead and waits in it while rank {d.rank_b}'s last call returned: where a job "
        f"stopped from outside (a time limit, Ctrl-C, a kill) found its ranks looks exactly like this; if nothing "
        f"stopped the job, rank {d.rank_b} is the one that never came: look at what it did after that call"
    )


_DDP_SETTING = re.compile(r"(find_unused_parameters|static_graph|bucket_cap_mb)=([^,;)]+)")
_BUILT_AT = re.compile(r"DDP built at ([^;)]+)")


def cause(d: Divergence) -> str | None:
    """A rank-local library setting that explains the divergence, when the records show one.

    DDP's reducer is shaped by settings each rank gives its own ``DistributedDataParallel``;
    ranks whose settings differ issue different collectives in ``backward()`` although their
    Python code runs the same lines.
    """
    a, b = d.call_a, d.call_b if d.call_b is not None else d.last_b
    if a is None or b is None or not (a.issuer and b.issuer):
        return _extra_pass(d)
    sa, sb = dict(_DDP_SETTING.findall(a.issuer)), dict(_DDP_SETTING.findall(b.issuer))
    differ = [k for k in sa if k in sb and sa[k] != sb[k]]
    if not differ:
        return _extra_pass(d)
    where = {r: (_BUILT_AT.search(c.issuer) or [None, "?"])[1] for r, c in ((d.rank_a, a), (d.rank_b, b))}
    settings = "; ".join(f"{k}={sa[k]} on rank {d.rank_a}, {k}={sb[k]} on rank {d.rank_b}" for k in differ)
    text = (
        f"the ranks built DistributedDataParallel with different settings ({settings}; built at "
        f"{where[d.rank_a]} on rank {d.rank_a}, {where[d.rank_b]} on rank {d.rank_b}), so their reducers "
        "issue different collectives in backward()"
    )
    if "find_unused_parameters" in differ:
        text += (
            "; with find_unused_parameters=True the reducer also all-reduces an int32 bitmap of the "
            "parameters used, which a reducer without it never issues"
        )
    return text


def _entry(stack: list[str], other: list[str]) -> tuple[str, str | None]:
    """Where ``stack`` leaves ``other``, outermost first: that frame's line and the function it called."""
    mine, theirs = list(reversed(stack)), list(reversed(other))
    pairs = enumerate(zip(mine, theirs, strict=False))
    i = next((k for k, (x, y) in pairs if x != y), min(len(mine), len(theirs)))
    i = min(i, len(mine) - 1)
    callee = mine[i + 1].rsplit(" ", 1)[-1] if i + 1 < len(mine) else None
    return mine[i], callee


def _extra_pass(d: Divergence) -> str | None:
    """A pass one rank ran and the other did not, when the stacks where the paths parted show it.

    The library issues the same collectives for the extra pass (an extra forward/backward through
    a helper) as for the next step's, so the calls differ only later. The rank that now issues
    the divergent call from the path the other rank took at the parting is the one that ran more.
    """
    p = d.parted
    if not p or d.call_a is None:
        return None
    stacks = {int(r): s for r, s in p["stacks"].items()}  # JSON made the ranks strings
    sa, sb = stacks.get(d.rank_a), stacks.get(d.rank_b)
    if not sa or not sb:
        return None
    extra = None
    if d.call_a.stack and d.call_a.stack == sb:
        extra, other, se, so = d.rank_a, d.rank_b, sa, sb
    elif d.call_b is not None and d.call_b.stack and d.call_b.stack == sa:
        extra, other, se, so = d.rank_b, d.rank_a, sb, sa
    if extra is None:
        return (
            f"the ranks ran different code that issues the same collectives, from call #{p['seq']} on group "
            f"{d.group} on (see where their paths parted, below): one of them ran a pass the other did not "
            "(an extra forward/backward through a helper, a skipped step)"
        )
    line, callee = _entry(se, so)
    into = f" (into {callee})" if callee else ""
    return (
        f"rank {extra} ran an extra pass that rank {other} did not: the call at {line}{into}. It issued the "
        f"same collectives as rank {other}'s next step (from call #{p['seq']} on group {d.group}, see where "
        f"their paths parted, below), so the calls differ only later, where rank {extra} is a pass behind"
    )


def _row(label: str, left: str, right: str, width: int) -> str:
    return f"  {label:<9} {left:<{width}}  {right}"


def format_divergence(d: Divergence) -> str:
    """The full human report."""
    lines = [headline(d), f"  (found by: {d.source})", ""]
    left = d.call_a
    right = d.call_b if d.call_b is not None else d.last_b
    right_title = f"rank {d.rank_b}" + ("" if d.call_b is not None else " (last recorded call)")
    if d.kind == "extra":
        right_title = f"rank {d.rank_b} (no matching call)"
    if d.kind == "unreceived" and d.call_b is not None:
        right_title = f"rank {d.rank_b} (waits here instead)"
    cols = [
        ("op", lambda c: c.op),
        ("numel", lambda c: str(c.numel)),
        ("dtype", lambda c: c.dtype),
        ("reduce", lambda c: c.redop or "-"),
        ("root", lambda c: "-" if c.root is None else str(c.root)),
        (
            "seq",
            lambda c: (
                f"#{c.group_seq} on group {c.group}" if c.group_seq is not None else f"p2p peer {c.peer}"
            ),
        ),
        ("site", lambda c: c.site),
        ("library", lambda c: c.lib_site or "-"),
        ("returned", lambda c: "yes" if c.t_end is not None else "no / unknown"),
    ]
    values_left = [f(left) if left else "-" for _, f in cols]
    width = max(len(f"rank {d.rank_a}"), *(len(v) for v in values_left))
    lines.append(_row("", f"rank {d.rank_a}", right_title, width))
    for (label, f), lv in zip(cols, values_left, strict=False):
        mark = "*" if d.kind == "mismatch" and label in d.differing else " "
        lines.append(_row(label + mark, lv, f(right) if right else "-", width))
    for rank, c in ((d.rank_a, left), (d.rank_b, right)):
        if c is not None and c.issuer:
            lines.append(f"  rank {rank}'s call was issued from C++ by: {c.issuer}")
    reason = cause(d)
    if reason:
        lines[1:1] = [f"  Cause: {reason}"]
    for rank, c in ((d.rank_a, left), (d.rank_b, right)):
        if c is not None and c.stack:
            lines.append("")
            lines.append(f"  rank {rank}'s user stack (outermost first, the call last):")
            lines.extend(f"    {frame}" for frame in reversed(c.stack))
    if len(d.extra_calls) > 1:
        lines.append("")
        lines.append(f"  all extra calls on rank {d.rank_a}:")
        lines.extend(f"    #{c.group_seq} {_where(c)}" for c in d.extra_calls)
    if d.parted:
        p = d.parted
        lines.append("")
        lines.append(
            f"  the ranks' paths first parted at call #{p['seq']} on group {d.group} ({p['call']} on each, "
            "issued from different lines):"
        )
        for rank, stack in sorted(p["stacks"].items(), key=lambda x: int(x[0])):
            lines.append(f"    rank {rank}: " + " > ".join(reversed(stack)))
    if d.before:
        lines.append("")
        lines.append(f"  calls before it on rank {d.rank_a} (equal in op and size on the ranks):")
        for ca, _ in d.before:
            lines.append(f"    #{ca.group_seq} {_where(ca)}")
    return "\n".join(lines)


def _call_json(c: CallRecord | None) -> dict[str, Any] | None:
    return None if c is None else c.to_json()


def divergence_to_json(d: Divergence) -> dict[str, Any]:
    """Machine-readable form of a divergence (stable keys)."""
    return {
        "kind": d.kind,
        "summary": headline(d),
        "group": d.group,
        "ranks": list(d.ranks),
        "rank_a": d.rank_a,
        "rank_b": d.rank_b,
        "call_a": _call_json(d.call_a),
        "call_b": _call_json(d.call_b),
        "differing": d.differing,
        "extra_calls": [c.to_json() for c in d.extra_calls],
        "last_b": _call_json(d.last_b),
        "missing_ranks": d.missing_ranks,
        "before": [[ca.to_json(), _call_json(cb)] for ca, cb in d.before],
        "source": d.source,
        "parted": d.parted,
    }


def divergence_from_json(d: dict[str, Any]) -> Divergence:
    """Inverse of :func:`divergence_to_json` (used for check failures read back from trace files)."""

    def call(x: dict[str, Any] | None) -> CallRecord | None:
        return None if x is None else CallRecord.from_json(x)

    return Divergence(
        kind=d["kind"],
        group=d["group"],
        ranks=tuple(d["ranks"]),
        rank_a=d["rank_a"],
        rank_b=d["rank_b"],
        call_a=call(d["call_a"]),
        call_b=call(d["call_b"]),
        differing=list(d["differing"]),
        extra_calls=[CallRecord.from_json(x) for x in d["extra_calls"]],
        last_b=call(d["last_b"]),
        missing_ranks=list(d["missing_ranks"]),
        before=[(call(a), call(b)) for a, b in d["before"]],
        source=d["source"],
        parted=d.get("parted"),
    )
