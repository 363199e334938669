"""Fingerprints and check-mode parsing: what ranks must agree on, and what may differ."""

from __future__ import annotations

import pytest

from repro.collectives.check.checker import CheckMode
from tests.unit.collectives.helpers import call


def test_equal_byte_size_dtypes_differ_in_fingerprint():
    a, b = call(0, 1, numel=4, dtype="float32"), call(1, 1, numel=4, dtype="int32")
    assert a.fingerprint() != b.fingerprint() and a.differing_fields(b) == ["dtype"]


def test_call_site_and_rank_are_not_part_of_the_fingerprint():
    assert call(0, 1, site="a.py:1 f").fingerprint() == call(1, 1, site="b.py:2 g").fingerprint()


def test_object_collectives_may_differ_in_size():
    a, b = call(0, 1, op="all_gather_object", numel=10), call(1, 1, op="all_gather_object", numel=99)
    assert a.fingerprint() == b.fingerprint()


def test_uneven_all_to_all_single_may_differ_in_size():
    a, b = call(0, 1, op="all_to_all_single", numel=10), call(1, 1, op="all_to_all_single", numel=12)
    a.size_free = b.size_free = True
    assert a.fingerprint() == b.fingerprint()


@pytest.mark.parametrize(("text", "every"), [("off", 0), ("every", 1), ("sample:10", 10), ("SAMPLE:3", 3)])
def test_check_mode_parses(text, every):
    mode = CheckMode.parse(text)
    assert mode.every == every and CheckMode.parse(mode.text) == mode


def test_check_mode_sampling_picks_every_nth_call():
    assert [n for n in range(1, 31) if CheckMode.parse("sample:10").wants(n)] == [10, 20, 30]


@pytest.mark.parametrize("bad", ["sometimes", "sample:0", "sample:x", "every:2"])
def test_bad_check_mode_names_the_key_and_choices(bad):
    with pytest.raises(ValueError, match=r"REPRO_COLLECTIVES_CHECK=.*valid: off, every, sample:N"):
        CheckMode.parse(bad, source="REPRO_COLLECTIVES_CHECK")
