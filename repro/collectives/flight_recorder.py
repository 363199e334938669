"""Read PyTorch Flight Recorder dumps as a second input format.

Flight Recorder (on with ``TORCH_FR_BUFFER_SIZE=N``, older name ``TORCH_NCCL_TRACE_BUFFER_SIZE``)
keeps the last N collectives of each process group; ``torch._C._distributed_c10d._dump_fr_trace()``
returns them as a pickled dict, and NCCL's watchdog writes the same pickle to
``$TORCH_FR_DUMP_TEMP_FILE<rank>`` on a timeout. In torch 2.13 gloo process groups record into it
too. Keys used here: ``version``, ``pg_config`` (group name -> ``ranks`` as text),
``entries`` (``profiling_name`` like ``nccl:all_reduce``, ``process_group`` (name, desc),
``collective_seq_id``, ``p2p_seq_id``, ``is_p2p``, ``input_sizes``, ``input_dtypes``,
``frames`` innermost first, ``time_created_ns``, ``state``). The file name must end in the rank.
"""

from __future__ import annotations

import ast
import math
import pathlib
import pickle
import re
from typing import Any

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
