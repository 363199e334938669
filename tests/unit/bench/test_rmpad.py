"""``repro.bench.rmpad``: a compiled case or FA4 it cannot run is refused before any worker starts."""

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


def test_fa4_with_a_torch_that_refuses_its_backward_is_one_line_and_exit_2_before_any_worker(capsys, tmp_path,
                                                                                             monkeypatch):
    import importlib.metadata

    from repro.config import rules

    # the installed torch among those the rule refuses (torch 2.11, measured on an H200; CI runs another)
    monkeypatch.setattr(rules, "FA4_REFUSED_TORCH", (importlib.metadata.version("torch"),))
    assert rmpad.main(["--cases", "rmpad", "--shape", "tiny", "--flash-attention", "fa4",
                       "--workdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --flash-attention fa4: torch ") and "refuses the backward" in err and "\n" not in err
    assert not any(tmp_path.iterdir())
