"""``repro.bench.rmpad``: a compiled case it cannot run is refused before any worker starts."""

from __future__ import annotations

import pytest

from repro.bench import rmpad


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
