"""Wall and CPU seconds of a command and every process it starts, Ray's daemons and workers included.

``/usr/bin/time`` counts only the children that are waited for; a Ray job's rank workers are
not (raylet does not reap them into its own usage), so their CPU goes uncounted. This wrapper runs
the command in a cgroup-v1 ``cpuacct`` group of its own, which every descendant inherits, and
reads the group's CPU time when the command and everything it started have exited. Needs a
writable ``/sys/fs/cgroup/cpuacct`` (root in a container, as on the CI machine).

    python scripts/cpu_time.py [--json FILE] -- COMMAND ...
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
# How long descendants that outlive the command (Ray daemons shutting down) are waited for.
_LINGER_S = 120.0


def _ticks_to_s(stat: str) -> dict[str, float]:
    hz = os.sysconf("SC_CLK_TCK")
    return {k: int(v) / hz for k, v in (line.split() for line in stat.splitlines())}


def main(argv: list[str]) -> int:
    out = None
    if argv[:1] == ["--json"]:
        out, argv = argv[1], argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    group = CPUACCT / f"cpu_time_{os.getpid()}"
    try:
        group.mkdir()
    except OSError as e:
        print(f"error: cannot create a cpuacct cgroup under {CPUACCT}: {e}", file=sys.stderr)
        return 2
    try:
        started = time.monotonic()
        rc = subprocess.call(argv, preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
        wall = time.monotonic() - started
        deadline = time.monotonic() + _LINGER_S
        while (group / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.5)
        left = len((group / "cgroup.procs").read_text().split())
        total = int((group / "cpuacct.usage").read_text()) / 1e9
        split = _ticks_to_s((group / "cpuacct.stat").read_text())
    finally:
        if not (group / "cgroup.procs").read_text().strip():
            group.rmdir()
    figures = {"rc": rc, "wall_s": round(wall, 1), "cpu_s": round(total, 1), "user_s": round(split["user"], 1),
               "sys_s": round(split["system"], 1), "load_avg": [round(x, 1) for x in os.getloadavg()],
               "still_running": left}
    print(f"[cpu_time] {json.dumps(figures)}", file=sys.stderr)
    if out:
        with open(out, "w") as f:
            json.dump(figures, f)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
