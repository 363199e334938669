#!/usr/bin/env bash
# The CPU suites on a second platform: a machine whose Python already holds torch, transformers,
# pytest, pytest-xdist and hypothesis, and that gets this checkout (and any packages carried as
# wheels, e.g. /tmp/site) through PYTHONPATH. Nothing is installed; the project is not pip-installed.
#
#   PYTHON=/opt/torch/.venv/bin/python PYTHONPATH=/tmp/site OUT=$OUT scripts/cpu_suite_elsewhere.sh [SUITE ...] [-- PYTEST_ARGS]
# REPRO_COMMIT names the commit in the record where the copy has no (or a stale) .git.
#
# SUITE: unit (fast unit tests), distributed (tests/distributed, all of it), slow (slow-marked unit
# tests), e2e (tests/e2e: whole jobs), verl (tests/verl_parity, only when `import verl` works in
# $PYTHON). Default: all five.
# PYTEST_ARGS go to every suite (e.g. `-- -k remove_padding` for a subset).
# Environment: JOBS (xdist workers, default 8; 0 runs in one process), PYTHON (default python3),
# OUT (where the record and the logs go; default results/cpu_suite_elsewhere/ in the checkout).
#
# Every suite runs with DS_ACCELERATOR=cpu (DeepSpeed's CPU accelerator, so torch.distributed runs
# on gloo), OMP_NUM_THREADS=1 (as in CI; several ranks share the cores) and the hypothesis `ci`
# profile (derandomized: the same examples on every machine; the profile and seed are printed in
# pytest's header). The record (CPU model, date, versions, per-suite counts and times) is written to
# $OUT/cpu_suite_record.md and printed; the exit status is non-zero when any suite failed.
#
# On the GPU machine (no network: deepspeed, ray, hydra-core, omegaconf carried as wheels into /tmp/site; the
# two halves of the Ray wheel in calls of their own, as the wheel folder and the tree together pass the carry
# limit), the four CPU suites took 488 s in one call with 14 workers (results/cpu_suite_elsewhere/README.md,
# session 24), under the 10-minute limit:
#   PYTHON=python3 PYTHONPATH=/tmp/site JOBS=14 bash scripts/cpu_suite_elsewhere.sh unit distributed e2e slow
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
JOBS="${JOBS:-8}"
OUT_DIR="${OUT:-$ROOT/results/cpu_suite_elsewhere}"
mkdir -p "$OUT_DIR"

suites=()
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --) shift; extra=("$@"); break ;;
        unit|distributed|slow|e2e|verl) suites+=("$1"); shift ;;
        *) echo "unknown suite '$1' (unit, distributed, slow, e2e, verl; pytest arguments after --)" >&2; exit 2 ;;
    esac
done
[ ${#suites[@]} -eq 0 ] && suites=(unit distributed slow e2e verl)

# The checkout first, then whatever the machine's environment already puts on PYTHONPATH (its wheels).
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
export HYPOTHESIS_PROFILE=ci CI=1 PYTHONUNBUFFERED=1
unset REPRO_GPU_TESTS

xdist=()
if [ "$JOBS" != 0 ]; then
    if "$PYTHON" -c "import xdist" 2>/dev/null; then xdist=(-n "$JOBS"); else echo "pytest-xdist missing: one process" >&2; fi
fi

versions="$("$PYTHON" - <<'EOF'
import importlib, platform
out = [f"python {platform.python_version()}"]
for name in ("torch", "transformers", "deepspeed", "ray", "hydra", "hypothesis", "verl"):
    try:
        out.append(f"{name} {importlib.import_module(name).__version__}")
    except Exception as exc:  # absent or broken: say which
        out.append(f"{name} absent ({type(exc).__name__})")
print(", ".join(out))
EOF
)"
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
record="$OUT_DIR/cpu_suite_record.md"
{
    echo "# CPU suites on $(hostname)"
    echo
    echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "- CPU: $cpu, $(getconf _NPROCESSORS_ONLN) cores online"
    echo "- commit: ${REPRO_COMMIT:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
    echo "- $versions"
    echo "- DS_ACCELERATOR=cpu (gloo), OMP_NUM_THREADS=1, HYPOTHESIS_PROFILE=ci, xdist: ${xdist[*]:-none}, extra args: ${extra[*]:-none}"
    echo
    echo "| suite | passed | failed | errors | skipped | seconds |"
    echo "| --- | --- | --- | --- | --- | --- |"
} > "$record"

status=0
for suite in "${suites[@]}"; do
    case "$suite" in
        unit) args=(tests/unit -m "not slow") ;;
        distributed) args=(tests/distributed) ;;
        slow) args=(tests/unit -m slow) ;;
        e2e) args=(tests/e2e) ;;
        verl)
            if ! "$PYTHON" -c "import verl" 2>/dev/null; then
                echo "| verl | - | - | - | - | verl not importable: skipped |" >> "$record"
                continue
            fi
            args=(tests/verl_parity) ;;
    esac
    log="$OUT_DIR/$suite.log"
    junit="$(mktemp -t "junit-$suite-XXXX.xml")"
    start=$(date +%s.%N)
    "$PYTHON" -m pytest "${args[@]}" "${xdist[@]}" -q -p no:cacheprovider --junitxml="$junit" "${extra[@]}" > "$log" 2>&1
    rc=$?
    secs=$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")
    # rc 5: nothing collected (a subset that selects nothing here); not a failure of the suite
    [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ] && status=1
    "$PYTHON" - "$junit" "$suite" "$secs" "$rc" >> "$record" <<'EOF'
import sys
import xml.etree.ElementTree as ET
path, suite, secs, rc = sys.argv[1:]
try:
    root = ET.parse(path).getroot()
    s = root if root.tag == "testsuite" else root.find("testsuite")
    t, f, e, k = (int(s.get(a, 0)) for a in ("tests", "failures", "errors", "skipped"))
    print(f"| {suite} | {t - f - e - k} | {f} | {e} | {k} | {secs} (exit {rc}) |")
except Exception as exc:
    print(f"| {suite} | ? | ? | ? | ? | {secs} (exit {rc}; no junit report: {type(exc).__name__}) |")
EOF
    rm -f "$junit"
    # failures by name, so the record says which without the log
    grep -E "^(FAILED|ERROR) " "$log" | sed "s/^/    $suite: /" >> "$record.failures" || true
done
if [ -s "$record.failures" ]; then
    { echo; echo "Failed:"; echo; cat "$record.failures"; } >> "$record"
fi
rm -f "$record.failures"
cat "$record"
exit $status
