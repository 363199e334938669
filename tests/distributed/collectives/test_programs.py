"""The twin programs' table, on a representative row: the runner itself can fail a row."""

from __future__ import annotations

import pathlib

from tests.collectives_programs.run_table import expected_sites, run_one, table


def test_the_p2p_deadlock_twin_is_caught_in_check_mode_with_both_sites_and_its_clean_twin_is_clean(tmp_path):
    row = run_one("p2p_deadlock", "check", pathlib.Path(tmp_path))
    assert expected_sites("p2p_deadlock") == ["p2p_deadlock.py:11"]
    assert row.caught and row.sites_right and row.clean_clean, row
    assert row.headline.startswith("Deadlock: rank 0 waits in recv")
    assert "| p2p_deadlock | check | yes |" in table([row])


def test_the_raises_twin_leads_with_rank_1s_own_exception_naming_its_line_and_its_clean_twin_is_clean(tmp_path):
    row = run_one("raises", "record", pathlib.Path(tmp_path))
    assert row.caught and row.sites_right and row.clean_clean, row
    assert row.headline.startswith("Rank 1 never issued all_reduce")


def test_the_any_source_twin_pairs_receives_and_reports_the_extra_send_in_both_modes(tmp_path):
    assert expected_sites("p2p_any_source") == ["p2p_any_source.py:17", "p2p_any_source.py:18"]
    check = run_one("p2p_any_source", "check", pathlib.Path(tmp_path) / "check")
    assert check.caught and check.sites_right and check.clean_clean, check
    assert check.headline.startswith("Deadlock: rank 0 waits in barrier"), check.headline
    record = run_one("p2p_any_source", "record", pathlib.Path(tmp_path) / "record")
    assert record.caught and record.sites_right and record.clean_clean, record
    assert record.headline.startswith("Rank 1's send #3 to rank 0 (send numel=4"), record.headline
    assert "its last receive from rank 1 was #2" in record.headline
