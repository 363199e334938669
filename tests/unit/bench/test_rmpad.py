"""``repro.bench.rmpad``: the device-sync tally (the sync debug mode's warnings, counted by the line that issued
them), and a compiled case it cannot run refused before any worker starts."""

from __future__ import annotations

import warnings

import pytest

from repro.bench import rmpad
from repro.bench.rmpad import sync_sites

SYNC = "called a synchronizing CUDA operation"  # torch's sync debug mode's message (c10/cuda/CUDAFunctions)


def _caught(*events: tuple[str, str, int]) -> list:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for message, filename, lineno in events:
            warnings.warn_explicit(message, UserWarning, filename, lineno)
    return caught


def test_syncs_are_counted_by_issuing_line_and_other_warnings_are_not():
    caught = _caught((SYNC, "/x/lib/python3.12/site-packages/deepspeed/runtime/zero/stage_1_and_2.py", 1200),
                     (SYNC, "/tree/repro/workers/packing.py", 80),
                     (SYNC, "/x/lib/python3.12/site-packages/deepspeed/runtime/zero/stage_1_and_2.py", 1200),
                     ("some other warning", "/tree/repro/workers/actor.py", 10))
    total, sites = sync_sites(caught)
    assert total == 3
    assert sites == {"deepspeed/runtime/zero/stage_1_and_2.py:1200": 2, "/tree/repro/workers/packing.py:80": 1}
    assert list(sites) == ["deepspeed/runtime/zero/stage_1_and_2.py:1200", "/tree/repro/workers/packing.py:80"]


def test_no_sync_warning_is_zero_syncs():
    assert sync_sites(_caught(("unrelated", "/a.py", 1))) == (0, {})


@pytest.mark.parametrize("argv, env, part", [
    (["--zero-stage", "3"], None, "zero_stage=3 is not valid; choose 0, 1 or 2"),
    ([], "1", "TORCHDYNAMO_DISABLE=1 makes torch.compile do nothing; unset it"),
])
def test_a_compiled_case_it_cannot_run_is_one_line_and_exit_2_before_any_worker(argv, env, part, capsys, tmp_path,
                                                                               monkeypatch):
    monkeypatch.delenv("TORCHDYNAMO_DISABLE", raising=False)
    if env:
        monkeypatch.setenv("TORCHDYNAMO_DISABLE", env)
    assert rmpad.main(["--cases", "rmpad_compiled", "--shape", "tiny", "--workdir", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --cases rmpad_compiled: compiled decoder layers:") and part in err and "\n" not in err
    assert not any(tmp_path.iterdir())  # refused before the model folder is written
