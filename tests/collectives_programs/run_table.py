"""Run every twin program under the trace launcher in check and record mode and print the table.

    python tests/collectives_programs/run_table.py [--out results/collectives_programs.md] [NAME ...]

Per program and mode: caught? (the launcher exits non-zero with a report), seconds from the
divergent call (its recorded start time) to the end of the report, call sites right? (every line
marked ``# expect: <rank>|both`` in the program appears in the report as ``program.py:<line>``;
a line marked ``# raises: <rank>``, where that rank raises by itself, appears as the report shows
it: the output leads with ``rank <rank> raised`` and its traceback names the line as Python does)
and clean twin clean? (exit 0, no divergence).
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tests.subprocess_env import pythonpath

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROGRAMS = (
    "ddp",
    "fsdp2",
    "dtensor_tp",
    "functional",
    "async_ops",
    "p2p_size",
    "p2p_dtype",
    "p2p_deadlock",
    "p2p_any_source",
    "a2a_splits",
    "single_apis",
    "objects",
    "barrier",
    "subgroups",
    "zero3",
    # issue 24: collectives a library issues on the user's behalf, and a rank that raises
    "ddp_unused",
    "ddp_skip_helper",
    "fsdp2_helper",
    "zero3_gather",
    "raises",
)
MODES = {"check": "every", "record": "off"}
# Programs that call torch.distributed names newer than torch 2.6 (the oldest torch the project claims).
REQUIRES = {"single_apis": ("all_gather_single", "reduce_scatter_single")}


def lacking(program: str) -> list[str]:
    """The names ``program`` calls that this torch lacks (torch 2.11 has no *_single collectives)."""
    import torch.distributed as dist

    return [name for name in REQUIRES.get(program, ()) if not hasattr(dist, name)]


@dataclass
class Row:
    program: str
    mode: str
    caught: bool
    seconds: float | None
    sites_right: bool
    clean_clean: bool
    headline: str


def expected_sites(program: str) -> list[str]:
    lines = (HERE / f"{program}.py").read_text().splitlines()
    return [
        f"{program}.py:{i + 1}" for i, line in enumerate(lines) if re.search(r"# expect: (0|1|both)", line)
    ]


def expected_raises(program: str) -> list[tuple[int, int]]:
    """(rank, line) of each line marked ``# raises: <rank>``: where that rank raises by itself."""
    lines = (HERE / f"{program}.py").read_text().splitlines()
    return [(int(m.group(1)), i + 1) for i, line in enumerate(lines) if (m := re.search(r"# raises: (\d+)", line))]


def sites_shown(program: str, text: str) -> bool:
    """Whether the launcher's output (stdout first) shows every marked line as a report prints it.

    A rank's own exception leads the output, ahead of what the trace saw of its peers, and its
    traceback names the line in Python's form (``File ".../raises.py", line 10, in load_batch``),
    not as a call site.
    """
    if not all(s in text for s in expected_sites(program)):
        return False
    return all(
        text.startswith(f"rank {rank} raised ") and f'{program}.py", line {line}, in ' in text
        for rank, line in expected_raises(program)
    )


def _launch(program: str, check: str, twin: str, out: pathlib.Path) -> tuple[int, str, float]:
    env = dict(os.environ, PYTHONPATH=pythonpath(REPO))
    cmd = [
        sys.executable,
        "-m",
        "repro.collectives_trace",
        "launch",
        "--nproc-per-node",
        "2",
        "--check",
        check,
        "--timeout-s",
        "20",
        "--stall-s",
        "5",
        "--grace-s",
        "3",
        "--out",
        str(out),
        "--",
        str(HERE / f"{program}.py"),
        twin,
    ]
    try:
        done = subprocess.run(cmd, cwd=HERE, env=env, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired as exc:
        return (
            124,
            (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or ""),
            time.time(),
        )
    return done.returncode, done.stdout + done.stderr, time.time()


def run_one(program: str, mode: str, work: pathlib.Path) -> Row:
    from repro.collectives_trace import analyze

    out = work / f"{program}-{mode}"
    code, text, t_done = _launch(program, MODES[mode], "divergent", out / "divergent")
    div = None
    try:
        div = analyze(out / "divergent")[1]
    except ValueError:
        pass
    seconds = None
    if div is not None and div.call_a is not None:
        starts = [c.t for c in (div.call_a, div.call_b) if c is not None and c.t]
        seconds = t_done - min(starts) if starts else None
    caught = code not in (0, 124) and div is not None
    sites = sites_shown(program, text)
    clean_code, clean_text, _ = _launch(program, MODES[mode], "clean", out / "clean")
    clean = clean_code == 0 and "no divergence" in clean_text
    headline = ""
    if div is not None:
        from repro.collectives.analyze.report import headline as make_headline

        headline = make_headline(div)
    return Row(program, mode, caught, seconds, sites, clean, headline)


def table(rows: list[Row]) -> str:
    out = [
        "| program | mode | caught? | s from divergent call to report | both call sites right? | clean twin clean? |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        secs = f"{r.seconds:.1f}" if r.seconds is not None else "-"
        out.append(
            f"| {r.program} | {r.mode} | {'yes' if r.caught else 'NO'} | {secs} | "
            f"{'yes' if r.sites_right else 'NO'} | {'yes' if r.clean_clean else 'NO'} |"
        )
    return "\n".join(out)


def run(programs: list[str], modes: list[str], jobs: int = 2) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="ct_programs_") as tmp, ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(run_one, p, m, pathlib.Path(tmp)) for p in programs for m in modes]
        return [f.result() for f in futures]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", help=f"programs (default all: {', '.join(PROGRAMS)})")
    ap.add_argument("--modes", default="check,record")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", help="also write the table (markdown) here")
    args = ap.parse_args()
    bad = [n for n in args.names if n not in PROGRAMS]
    if bad:
        print(f"error: unknown program(s) {bad}; valid: {', '.join(PROGRAMS)}", file=sys.stderr)
        return 2
    start = time.time()
    programs = args.names or list(PROGRAMS)
    for name in programs:
        if lacking(name):
            print(f"skipped {name}: this torch has no torch.distributed.{', '.join(lacking(name))}", file=sys.stderr)
    rows = run([n for n in programs if not lacking(n)], args.modes.split(","), args.jobs)
    text = table(rows)
    print(text)
    for r in rows:
        print(f"  {r.program}/{r.mode}: {r.headline}")
    if args.out:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        pathlib.Path(args.out).write_text(
            f"# Collective trace: twin programs (2 gloo ranks, CPU)\n\n{stamp}; "
            f"`python {' '.join(sys.argv)}`; {time.time() - start:.0f} s in all\n\n{text}\n\n"
            + "\n".join(f"- {r.program}/{r.mode}: {r.headline}" for r in rows)
            + "\n"
        )
    return 0 if all(r.caught and r.sites_right and r.clean_clean for r in rows) else 1


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
