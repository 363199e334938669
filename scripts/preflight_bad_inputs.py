"""Write results/preflight_bad_inputs.md: every bad input of tests/unit/run/test_preflight.py, run as
``python -m repro.main_ppo`` subprocesses, with exit status, seconds to fail and the message.

    PYTHONPATH=. DS_ACCELERATOR=cpu python scripts/preflight_bad_inputs.py [results/preflight_bad_inputs.md]
"""

from __future__ import annotations

import platform
import sys
import tempfile
import time
from pathlib import Path

from tests.unit.run.test_preflight import BASE, bad_inputs, make_inputs, run_subprocess


def main(out: Path) -> int:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        make_inputs(tmp)
        for case in bad_inputs(tmp):
            code, seconds, cpu, err = run_subprocess(case, tmp)
            msg = " ".join(ln for ln in err.strip().splitlines() if ln.startswith("error:")).replace(d, "$TMP")
            rows.append((case, code, seconds, cpu, msg.replace("|", "\\|")))
            print(f"{code} {seconds:5.2f}s {case.name}", file=sys.stderr)
    lines = [
        "# Bad inputs: every one stops before Ray starts",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.node()} (CPU, 2 shared cores, noisy), "
        "with `PYTHONPATH=. DS_ACCELERATOR=cpu python scripts/preflight_bad_inputs.py`.",
        f"Each row is `python -m repro.main_ppo {' '.join(BASE)} <overrides>` with one mistake "
        "($TMP: the script's temporary folder); seconds are the whole subprocess, Python start included.",
        "",
        "| bad input | overrides (env) | exit | seconds (wall) | CPU s | message (stderr) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for case, code, seconds, cpu, msg in rows:
        ov = " ".join(case.overrides).replace(str(tmp), "$TMP")
        env = " ".join(f"{k}={v!r}" for k, v in case.env.items())
        lines.append(f"| {case.name} | `{ov}`{f' ({env})' if env else ''} | {code} | {seconds:.2f} | {cpu:.2f} | {msg} |")
    worst = max(r[2] for r in rows)
    ok = all(r[1] == 2 for r in rows)
    lines += ["", f"{len(rows)} inputs; all exit 2: {ok}; slowest {worst:.2f} s wall."]
    out.write_text("\n".join(lines) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "results/preflight_bad_inputs.md")))
