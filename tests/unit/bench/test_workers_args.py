"""The worker benchmark refuses an SP layout it cannot run before any rank starts."""

from __future__ import annotations

import pytest

from repro.bench import workers


@pytest.mark.parametrize("argv, part", [
    (["--sp", "2", "--runners", "worker,bare"], "--runners worker"),
    (["--sp", "3", "--nproc", "2", "--runners", "worker"], "divide --nproc=2"),
    (["--sp", "0", "--runners", "worker"], "--sp=0"),
])
def test_sp_the_bench_cannot_run_is_one_line_and_exit_2(argv, part, capsys, tmp_path):
    assert workers.main([*argv, "--workdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --sp=") and part in err and "\n" not in err
    assert not any(tmp_path.iterdir())  # refused before the model folder is written
