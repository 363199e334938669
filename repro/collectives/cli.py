"""The command line of the trace tool: ``python -m repro.collectives_trace launch|analyze|export|run``.

``launch`` runs a target on N local ranks (:mod:`repro.collectives.launch`) and reports what the
ranks raised, the hang it ended and the first divergence of their records; ``analyze`` and
``export`` read a trace directory (:mod:`repro.collectives.analyze`); ``run`` is one rank: it
turns tracing on from the environment (:mod:`repro.collectives.record`), arms the Flight Recorder
dumps and runs the target in this process, as torchrun or ``launch`` start it. The usage is in
:mod:`repro.collectives_trace`, the entry point. The top of the trace tool: may import every part.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import runpy
import sys
import time

from repro.collectives.analyze.findings import analyze, strided_notes
from repro.collectives.analyze.report import divergence_to_json, format_divergence
from repro.collectives.check.checker import CHECK_CHOICES, CheckMode
from repro.collectives.events import RankTrace

# ``record`` (which imports torch) is imported by ``run`` only: ``launch``, ``analyze`` and ``export``
# never touch torch, and importing it cost each launcher process ~3 CPU s on a 2-core machine.

DESCRIPTION = (
    "Collective trace: record, live-check, analyse and export the collectives of any torch.distributed job."
)


def _summary(traces: dict[int, RankTrace]) -> str:
    parts = [f"rank {r}: {len(t.calls)} calls" for r, t in sorted(traces.items())]
    return "; ".join(parts)


def _cmd_analyze(args: argparse.Namespace) -> int:
    traces, div = analyze(args.dir)
    if args.json:
        print(
            json.dumps(
                {
                    "ranks": {r: len(t.calls) for r, t in traces.items()},
                    "divergence": divergence_to_json(div) if div else None,
                    "notes": strided_notes(traces),
                },
                indent=2,
            )
        )
    else:
        print(_summary(traces))
        print(
            format_divergence(div)
            if div
            else "No divergence: every group's ranks issued the same collectives."
        )
        if div is None:
            from repro.collectives.analyze.align import first_site_difference

            note = first_site_difference(traces)
            if note:
                print(note)
        for note in strided_notes(traces):
            print(note)
    return 1 if div else 0


def _cmd_export(args: argparse.Namespace) -> int:
    from repro.collectives.analyze.formats import write_chrome_trace

    traces, div = analyze(args.dir)
    write_chrome_trace(traces, div, pathlib.Path(args.chrome))
    print(f"wrote {args.chrome} ({_summary(traces)}; divergence: {'marked' if div else 'none'})")
    return 0


def _cmd_launch(args: argparse.Namespace) -> int:
    from repro.collectives.launch.launcher import Target, launch, log_tail, own_exception, raised_report

    CheckMode.parse(args.check, source="--check")
    rest = list(args.target)
    if rest and rest[0] == "--":
        rest = rest[1:]
    target = Target.parse(rest)
    out = pathlib.Path(args.out)
    result = launch(target, args.nproc_per_node, out, args.check, args.timeout_s, args.grace_s, args.stall_s)
    codes = result.codes
    traces, div = analyze(out) if any(out.glob("rank*.jsonl")) else ({}, None)
    failed = {r: c for r, c in enumerate(codes) if c != 0}
    own = [r for r in failed if r not in result.killed]
    # A rank's own exception leads: what the trace then says of its peers is a consequence.
    # (also a rank the launcher killed while it was still tearing down after raising)
    raised = {r: tb for r in failed if (tb := own_exception(out, r)) is not None}
    if raised:
        print(raised_report(raised))
    if raised and div is not None:
        print("What the collective trace saw (the peers of a rank that raised wait for it):")
    if result.interrupted is not None:
        import signal

        print(
            f"interrupted by {signal.Signals(result.interrupted).name}: every rank stopped; what was recorded:"
        )
    if result.stalled_s is not None:
        print(
            f"no rank made progress for {result.stalled_s:.0f} s with a call outstanding: the job hangs; "
            "ranks stopped"
        )
    if div is not None:
        print(format_divergence(div))
    for rank, stack in sorted(result.stacks.items()):
        if stack.strip():
            print(f"\nPython stacks of rank {rank} when it was stopped:\n{stack.rstrip()}")
    for r in own:
        # A rank that failed on its own before recording anything, without a Python traceback
        # (a signal, os._exit): the end of its log is the story.
        if r not in raised and (div is None or r not in traces or not traces[r].calls):
            print(
                f"\nrank {r} failed ({_exit(codes[r])}); end of {out / f'rank{r}.log'}:\n{log_tail(out, r)}"
            )
    if failed:
        print(
            "ranks that failed: "
            + ", ".join(
                f"rank {r} ({_exit(c)}{', stopped by the launcher' if r in result.killed else ''})"
                for r, c in failed.items()
            )
            + f"; logs in {out}"
        )
    elif div is None:
        print(f"all {len(codes)} ranks exited 0; no divergence ({_summary(traces)})")
    for note in strided_notes(traces):
        print(note)
    if result.interrupted is not None:
        return 128 + int(result.interrupted)
    return 1 if (failed or div is not None) else 0


def _exit(code: int) -> str:
    if code < 0:
        import signal

        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _run_target(args: argparse.Namespace):  # -> launch.Target
    from repro.collectives.launch.launcher import Target

    if args.module:
        return Target(args.module[0], tuple(args.module[1:]), module=True)
    return Target(args.script, tuple(args.args))


def _check_run(args: argparse.Namespace) -> None:
    """One clear line (ValueError) before the script starts: no trace directory, or no such target."""
    from repro.collectives.record.session import ENV_DIR

    if not os.environ.get(ENV_DIR):
        raise ValueError(
            f"run traces into the directory named by {ENV_DIR}, which is not set; "
            f"set it ({ENV_DIR}=trace/) or use 'launch', which sets it"
        )
    _run_target(args).check()
    _stall_s()


def _stall_s() -> float:
    from repro.collectives.record.session import DEFAULT_STALL_S, ENV_STALL

    raw = os.environ.get(ENV_STALL, str(DEFAULT_STALL_S))
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{ENV_STALL}={raw!r} is not a number of seconds") from None


def _cmd_run(args: argparse.Namespace) -> int:
    from repro.collectives.launch.stall import arm_flight_recorder, register_stack_dump
    from repro.collectives.record.session import ENV_DIR, install_from_env
    from repro.collectives.record.tracer import active

    target = _run_target(args)
    register_stack_dump()
    # Under torchrun nothing else watches this rank: it dumps its Flight Recorder itself on a stall.
    arm_flight_recorder(os.environ[ENV_DIR], stall_s=_stall_s())
    install_from_env()
    sys.argv = [target.name, *target.args]
    try:
        if target.module:
            # run_module(alter_sys=True) replaces argv[0] with the module's file, as python -m does.
            runpy.run_module(target.name, run_name="__main__", alter_sys=True)
        else:
            # As plain python does: the script's folder first on sys.path, so modules beside it import.
            sys.path[0] = os.path.dirname(os.path.abspath(target.name))
            runpy.run_path(target.name, run_name="__main__")
    finally:
        # The hang watch: this rank waits for no one now, however long its teardown takes
        # (after an exception too: the rank is on its way out).
        tracer = active()
        if tracer is not None:
            tracer.pending.settle()
            tracer.write_event({"ev": "end", "t": time.time()})
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m repro.collectives_trace", description=DESCRIPTION)
    sub = p.add_subparsers(dest="cmd", required=True)
    la = sub.add_parser(
        "launch", help="run SCRIPT (or -m MODULE) on N local ranks with tracing; report on divergence"
    )
    la.add_argument("--nproc-per-node", type=int, required=True)
    la.add_argument("--check", default="every", help=f"check mode: {CHECK_CHOICES} (default every)")
    la.add_argument("--out", required=True, help="trace directory")
    la.add_argument("--timeout-s", type=float, default=60.0, help="check mode: seconds to wait for a peer")
    la.add_argument(
        "--grace-s", type=float, default=5.0, help="after a rank fails, seconds before the rest are killed"
    )
    la.add_argument(
        "--stall-s",
        type=float,
        default=30.0,
        help="end the job as hung after this many seconds without progress on any rank (0: never)",
    )
    la.add_argument("target", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS] or -- -m MODULE [ARGS]")
    an = sub.add_parser("analyze", help="report the first divergence of a trace directory")
    an.add_argument("dir")
    an.add_argument("--json", action="store_true", help="print JSON instead of text")
    ex = sub.add_parser("export", help="write a Chrome/Perfetto trace with the divergence marked")
    ex.add_argument("dir")
    ex.add_argument("--chrome", required=True, help="output .json file")
    ru = sub.add_parser(
        "run",
        help="run SCRIPT (or -m MODULE) in this process with tracing from the environment (for torchrun)",
    )
    # -m takes the rest of the line, as python's does: ``run -m MODULE [ARGS]``.
    ru.add_argument(
        "-m",
        dest="module",
        nargs=argparse.REMAINDER,
        metavar="MODULE [ARGS]",
        help="-m MODULE [ARGS]: run a module as 'python -m' does",
    )
    ru.add_argument("script", nargs="?", help="SCRIPT [ARGS]: run a script file")
    ru.add_argument("args", nargs=argparse.REMAINDER)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cmd == "run":
        if (args.module is None) == (args.script is None) or args.module == []:
            parser.error("run needs either SCRIPT [ARGS] or -m MODULE [ARGS]")
        try:
            _check_run(args)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return _cmd_run(args)  # the script's own exceptions must surface unchanged
    handler = {"launch": _cmd_launch, "analyze": _cmd_analyze, "export": _cmd_export}[args.cmd]
    try:
        return handler(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

