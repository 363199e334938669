"""Benchmark commands given one work folder share its model and never a result file."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.bench.workdir import open_workdir, save_once


def test_two_commands_on_one_workdir_get_run_folders_of_their_own(tmp_path: Path) -> None:
    first, run_a = open_workdir(str(tmp_path / "w"), "x_")
    second, run_b = open_workdir(str(tmp_path / "w"), "x_")
    assert first == second == tmp_path / "w"
    assert run_a != run_b and run_a.parent == run_b.parent == first
    assert run_a.name.startswith("run_") and not any(run_a.iterdir())


def test_without_a_path_the_workdir_is_a_new_temporary_folder() -> None:
    a, _ = open_workdir(None, "repro_test_")
    b, _ = open_workdir(None, "repro_test_")
    assert a != b and a.name.startswith("repro_test_")


def _writer(text: str, calls: list[str]):
    def write(folder: Path) -> None:
        calls.append(text)
        (folder / "weights").write_text(text)
        (folder / "config.json").write_text("{}")
    return write


def test_the_model_folder_is_written_once_and_then_reused(tmp_path: Path) -> None:
    calls: list[str] = []
    out = save_once(tmp_path / "model", _writer("a", calls))
    assert save_once(tmp_path / "model", _writer("b", calls)) == out
    assert calls == ["a"] and (out / "weights").read_text() == "a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temporary folder left


def test_a_concurrent_writer_that_finished_first_wins_and_the_loser_leaves_nothing(tmp_path: Path) -> None:
    calls: list[str] = []
    out = tmp_path / "model"

    def slow(folder: Path) -> None:  # another invocation completes while this one is still writing
        save_once(out, _writer("first", calls))
        _writer("second", calls)(folder)

    assert save_once(out, slow) == out
    assert calls == ["first", "second"] and (out / "weights").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_writer_that_fails_leaves_no_model_folder(tmp_path: Path) -> None:
    def broken(folder: Path) -> None:
        (folder / "weights").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_once(tmp_path / "model", broken)
    assert not any(tmp_path.iterdir())
