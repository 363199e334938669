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
