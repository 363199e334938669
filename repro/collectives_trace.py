"""Collective trace: record, live-check, analyse and export the collectives of any torch.distributed job.

From code::

    with trace_collectives("trace/", check="every", timeout_s=30):
        train()

Inside any launcher (torchrun, Ray workers): set ``REPRO_COLLECTIVES_TRACE=<dir>`` (and optionally
``REPRO_COLLECTIVES_CHECK=every|sample:N|off``, ``REPRO_COLLECTIVES_TIMEOUT_S``) and call
:func:`install_from_env` early (``repro.cluster.process_group.init_distributed`` does), or start the script
through ``python -m repro.collectives_trace run SCRIPT`` (or ``run -m MODULE``); under ``run`` each rank
also dumps PyTorch's Flight Recorder into the directory when its record stalls with a call outstanding
(``REPRO_COLLECTIVES_STALL_S``, default 30) and on SIGTERM, for ``analyze``. From the shell::

    python -m repro.collectives_trace launch --nproc-per-node 2 --check every --out DIR -- script.py ARGS
    python -m repro.collectives_trace launch --nproc-per-node 2 --out DIR -- -m package.module ARGS
    python -m repro.collectives_trace analyze DIR [--json]
    python -m repro.collectives_trace export DIR --chrome trace.json

``launch`` also ends a job that hangs (``--stall-s``, default 30 s without progress) with the
report and every rank's Python stack. ``analyze`` reads our per-rank files (``rank*.jsonl``) and
PyTorch Flight Recorder dumps (alone, or beside our files for what ran below the Python API).

This module is the entry point and the public API; the tool lives in :mod:`repro.collectives`
(the command line in :mod:`repro.collectives.cli`).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from repro.collectives.analyze.align import Divergence
from repro.collectives.analyze.findings import analyze, load_traces, strided_notes
from repro.collectives.check.checker import CollectiveMismatchError
from repro.collectives.cli import main

if TYPE_CHECKING:  # imported on first use (__getattr__ below)
    from repro.collectives.record.session import install_from_env, trace_collectives

__all__ = [
    "CollectiveMismatchError",
    "Divergence",
    "analyze",
    "install_from_env",
    "load_traces",
    "main",
    "strided_notes",
    "trace_collectives",
]



def __getattr__(name: str):
    # The recording API imports torch; ``python -m repro.collectives_trace launch|analyze|export``
    # does not need it (~3 CPU s per process on a 2-core machine), so it is imported on first use.
    if name in ("install_from_env", "trace_collectives"):
        from repro.collectives.record import session

        return getattr(session, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    sys.exit(main())
