"""The GPU golden of the gate's seed-scale case (``scripts/goldens.py --case grpo_0p6b``), on recorded runs.

The golden (``fixtures/goldens/grpo_0p6b_gpu.json``) was made from runs on two H100 hosts whose exact
metrics agreed to the last bit; the gate (``tests/gpu_e2e/test_grpo_gate.py``) checks a fresh run with it.
Here, on CPU, the check is shown to pass on a recorded run and to fail on one changed bit of one metric
and on a slower step, and to skip on another machine.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "results" / "seed_scale" / "raw" / "2026-11-27-x4" / "grpo_0p6b_seed1_metrics.tsv"


def _goldens():
    spec = importlib.util.spec_from_file_location("goldens_script", ROOT / "scripts" / "goldens.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check(metrics: Path, capsys, identity: dict | None = None) -> tuple[int, str]:
    goldens = _goldens()
    identity = identity or json.loads(goldens.GPU_GOLDEN.read_text())["identity"]
    rc = goldens.main(["--check", "--case", "grpo_0p6b", "--run-dir", str(metrics), "--identity", json.dumps(identity)])
    return rc, capsys.readouterr().out


def _edited(tmp_path: Path, step: int, key: str, edit) -> Path:
    lines = RECORDED.read_text().splitlines()
    header = lines[0].split("\t")
    cells = lines[step].split("\t")
    col = header.index(key)
    cells[col] = repr(edit(float(cells[col])))
    lines[step] = "\t".join(cells)
    out = tmp_path / "metrics.tsv"
    out.write_text("\n".join(lines) + "\n")
    return out


def test_the_recorded_seed_scale_run_matches_its_gpu_golden(capsys):
    rc, out = _check(RECORDED, capsys)
    assert rc == 0 and out.startswith("OK: 30 steps"), out


def test_one_changed_bit_of_one_grad_norm_fails_the_golden(tmp_path, capsys):
    rc, out = _check(_edited(tmp_path, 17, "actor/grad_norm", lambda v: math.nextafter(v, math.inf)), capsys)
    assert rc == 1 and out.strip().splitlines() == [out.strip().splitlines()[0]]
    assert out.startswith("step 17 actor/grad_norm: golden"), out


def test_a_slower_run_fails_the_step_time_bound(tmp_path, capsys):
    slow = tmp_path / "slow.tsv"
    lines = RECORDED.read_text().splitlines()
    col = lines[0].split("\t").index("timing_s/step")
    rows = [ln.split("\t") for ln in lines[1:]]
    for cells in rows:
        cells[col] = repr(float(cells[col]) * 1.3)
    slow.write_text("\n".join([lines[0], *("\t".join(c) for c in rows)]) + "\n")
    rc, out = _check(slow, capsys)
    assert rc == 1 and "median step time" in out and "> bound" in out, out


def test_another_gpu_or_version_skips_with_what_differs(capsys):
    identity = dict(json.loads(_goldens().GPU_GOLDEN.read_text())["identity"], gpu="NVIDIA H200")
    rc, out = _check(RECORDED, capsys, identity)
    assert rc == 0 and out.startswith("SKIP: the golden is for") and "NVIDIA H200" in out, out


def test_compiled_log_prob_chunks_skip_the_golden_of_eager_ones(capsys):
    # The golden's runs predate the compiled log-prob chunks (CUDA's default since 2026-11-28): their
    # log-probs differ in the last bits, so a run with them is another identity, not a failure.
    golden = json.loads(_goldens().GPU_GOLDEN.read_text())["identity"]
    assert golden["logprob_chunks"] == "eager"
    rc, out = _check(RECORDED, capsys, dict(golden, logprob_chunks="compiled"))
    assert rc == 0 and out.startswith("SKIP: the golden is for") and "'logprob_chunks': 'compiled'" in out, out
