"""Other tools' formats: PyTorch Flight Recorder dumps read in, Chrome / Perfetto trace events written out.

**Flight Recorder dumps as a second input format.** Flight Recorder (on with
``TORCH_FR_BUFFER_SIZE=N``, older name ``TORCH_NCCL_TRACE_BUFFER_SIZE``) keeps the last N
collectives of each process group; ``torch._C._distributed_c10d._dump_fr_trace()`` returns them as
a pickled dict, and NCCL's watchdog writes the same pickle to ``$TORCH_FR_DUMP_TEMP_FILE<rank>`` on
a timeout. In torch 2.13 gloo process groups record into it too. Keys used here: ``version``,
``pg_config`` (group name -> ``ranks`` as text), ``entries`` (``profiling_name`` like
``nccl:all_reduce``, ``process_group`` (name, desc), ``collective_seq_id``, ``p2p_seq_id``,
``is_p2p``, ``input_sizes``, ``input_dtypes``, ``frames`` innermost first, ``time_created_ns``,
``state``). The file name must end in the rank.

**Chrome / Perfetto trace-event JSON, with the first divergence marked.** One process per rank,
one thread (track) per process group. Each call is a complete ("X") event from its start to its
return; a call that never returned runs to the end of the trace and is named "... (never
returned)". The divergent calls are coloured red ("terrible") and a global instant event carries
the headline, so it shows in chrome://tracing and ui.perfetto.dev.
"""

from __future__ import annotations

import ast
import json
import math
import pathlib
import pickle
import re
from typing import Any

from repro.collectives.analyze.align import Divergence
from repro.collectives.analyze.report import headline
from repro.collectives.callsite import sites_from_frames
from repro.collectives.events import CallRecord, RankTrace

# Flight Recorder stores c10d ScalarType names.
_DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Int": "int32",
    "Long": "int64",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
}
_TRAILING_INT = re.compile(r"(\d+)(\.\w+)?$")
_P2P = {"send", "recv", "isend", "irecv"}
# FR's inputs of these are the root's list and empty elsewhere.
_ROOTED_LISTS = {"scatter", "gather"}


def is_flight_recorder_dump(path: pathlib.Path) -> bool:
    """True when the file starts like a pickle (protocol 2+) and is not one of our JSON-lines files."""
    try:
        with open(path, "rb") as f:
            return f.read(1) == b"\x80"
    except OSError:
        return False


def load_dump(path: pathlib.Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        data = pickle.load(f)
    if not isinstance(data, dict) or "entries" not in data:
        raise ValueError(f"{path}: not a Flight Recorder dump (a pickled dict with 'entries')")
    return data


def _ranks_of(dump: dict[str, Any], pg_name: str, pg_desc: str) -> tuple[int, ...]:
    configs = dump.get("pg_config", {})
    cfg = configs.get(pg_name)
    if cfg is None:
        cfg = next(
            (c for c in configs.values() if c.get("desc") == pg_desc or c.get("name") == pg_name), None
        )
    if cfg is None and len(configs) == 1:
        cfg = next(iter(configs.values()))
    if cfg is None:
        return ()
    ranks = cfg.get("ranks", ())
    return tuple(ast.literal_eval(ranks) if isinstance(ranks, str) else ranks)


def dump_to_trace(dump: dict[str, Any], rank: int, source: str = "") -> RankTrace:
    """Convert one rank's dump into the record model used by the aligner."""
    trace = RankTrace(
        rank=rank, source=source, meta={"format": "flight_recorder", "version": dump.get("version")}
    )
    entries = sorted(dump["entries"], key=lambda e: (e.get("time_created_ns") or 0, e.get("record_id", 0)))
    for idx, e in enumerate(entries, start=1):
        backend, _, op = str(e.get("profiling_name", "")).rpartition(":")
        op = op or backend
        pg_name, pg_desc = (list(e.get("process_group", ("", ""))) + ["", ""])[:2]
        ranks = _ranks_of(dump, str(pg_name), str(pg_desc))
        group = str(pg_name)
        trace.groups.setdefault(group, ranks)
        sizes = e.get("input_sizes") or []
        dtypes = e.get("input_dtypes") or []
        frames = [
            (f.get("filename", ""), int(f.get("line", 0)), f.get("name", "")) for f in e.get("frames", [])
        ]
        site, lib_site = sites_from_frames(frames)
        is_p2p = bool(e.get("is_p2p")) or op in _P2P
        if op in _ROOTED_LISTS:
            sizes, dtypes = [], []  # only the root passes the list: its sizes say nothing about a mismatch
        created = e.get("time_created_ns")
        done = e.get("time_discovered_completed_ns")
        trace.calls.append(
            CallRecord(
                rank=rank,
                index=idx,
                op=op,
                group=group,
                ranks=ranks,
                group_seq=None if is_p2p else int(e.get("collective_seq_id", idx)),
                numel=sum(math.prod(s) for s in sizes),
                dtype=_DTYPES.get(dtypes[0], str(dtypes[0]).lower()) if dtypes else "",
                site=site,
                lib_site=lib_site,
                t=created / 1e9 if created else 0.0,
                # FR marks completion only where the backend reports it (NCCL); "retired" entries completed.
                t_end=(done / 1e9) if done else ((created / 1e9) if e.get("retired") and created else None),
            )
        )
    return trace


def read_dump_file(path: pathlib.Path) -> RankTrace:
    m = _TRAILING_INT.search(path.name)
    if not m:
        raise ValueError(
            f"{path}: cannot tell the rank of this Flight Recorder dump; name it so it ends in the rank "
            "(as TORCH_FR_DUMP_TEMP_FILE does, e.g. nccl_trace_rank_0)"
        )
    return dump_to_trace(load_dump(path), int(m.group(1)), source=str(path))


def read_dump_dir(directory: pathlib.Path) -> dict[int, RankTrace]:
    """Every Flight Recorder dump in a directory, by rank."""
    traces = {}
    for path in sorted(p for p in directory.iterdir() if p.is_file() and is_flight_recorder_dump(p)):
        t = read_dump_file(path)
        traces[t.rank] = t
    return traces


# -- Chrome / Perfetto export ------------------------------------------------------------------


def to_chrome_trace(traces: dict[int, RankTrace], divergence: Divergence | None) -> dict[str, Any]:
    """The trace-event document (``{"traceEvents": [...]}``), timestamps in microseconds."""
    starts = [c.t for t in traces.values() for c in t.calls if c.t]
    if not starts:
        return {"traceEvents": [], "displayTimeUnit": "ms", "metadata": {"divergence": None}}
    t0 = min(starts)
    t_last = max(max(c.t_end or c.t for t in traces.values() for c in t.calls), t0)
    marked: set[tuple[int, int]] = set()
    if divergence is not None:
        for c in (divergence.call_a, divergence.call_b, *divergence.extra_calls):
            if c is not None:
                marked.add((c.rank if c.rank >= 0 else divergence.rank_a, c.index))
    events: list[dict[str, Any]] = []
    for rank, trace in sorted(traces.items()):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
        tids: dict[str, int] = {}
        for c in trace.calls:
            key = "p2p" if c.group_seq is None else c.group
            if key not in tids:
                tids[key] = len(tids)
                label = "p2p" if key == "p2p" else f"group {key} {list(c.ranks)}"
                events.append(
                    {"ph": "M", "name": "thread_name", "pid": rank, "tid": tids[key], "args": {"name": label}}
                )
            end = c.t_end if c.t_end is not None else t_last
            ev = {
                "ph": "X",
                "name": c.op + ("" if c.t_end is not None else " (never returned)"),
                "cat": "collective" if c.group_seq is not None else "p2p",
                "pid": rank,
                "tid": tids[key],
                "ts": (c.t - t0) * 1e6,
                "dur": max((end - c.t) * 1e6, 1.0),
                "args": {
                    "seq": c.group_seq,
                    "numel": c.numel,
                    "dtype": c.dtype,
                    "site": c.site,
                    "library_site": c.lib_site,
                    "root": c.root,
                    "peer": c.peer,
                    "reduce_op": c.redop,
                },
            }
            if (rank, c.index) in marked:
                ev["cname"] = "terrible"
                ev["args"]["divergence"] = divergence.kind
            events.append(ev)
    meta: dict[str, Any] = {"divergence": None}
    if divergence is not None:
        text = headline(divergence)
        meta["divergence"] = text
        at = divergence.call_a.t if divergence.call_a else t0
        events.append(
            {
                "ph": "i",
                "s": "g",
                "name": f"DIVERGENCE: {text}",
                "pid": divergence.rank_a,
                "tid": 0,
                "ts": (at - t0) * 1e6,
                "cname": "terrible",
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms", "metadata": meta}


def write_chrome_trace(
    traces: dict[int, RankTrace], divergence: Divergence | None, path: pathlib.Path
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_chrome_trace(traces, divergence)))
