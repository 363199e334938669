"""The live check's store exchange on a real TCPStore: slots that are overwritten, and the deadlock test.

Each rank's payload for a checked call goes into one of two slots per group, overwritten two
checked calls later; a slot can hold the peer's previous call, which must not pass for the current
one. A peer whose last published call is ahead of this rank's may just have gone on after reading
this rank's key, which is no deadlock.
"""

from __future__ import annotations

import datetime
import json

import pytest
import torch.distributed as dist

from repro.collectives.check.checker import Checker, CheckMode
from repro.collectives.record.tracer import Tracer
from tests.unit.collectives.helpers import call


@pytest.fixture
def checker():
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
    c = Checker(CheckMode(1), timeout_s=5, session="t")
    c._store = store
    return c


def _publish(checker: Checker, rec, slot_of: int | None = None) -> None:
    payload = json.dumps(rec.to_json())
    slot = (rec.group_seq if slot_of is None else slot_of) % 2
    checker.store().multi_set([checker._key(rec.group, slot, rec.rank), checker.last_key(rec.rank)], [payload, payload])


def test_a_slot_still_holding_the_peers_previous_call_is_not_taken_for_the_current_one(checker):
    mine = call(0, 6)
    keys = {1: checker._key("0", 0, 1)}
    calls = {0: mine}
    _publish(checker, call(1, 4))  # slot 0, two checked calls ago
    assert not checker._collect(mine, keys, calls) and 1 not in calls
    _publish(checker, call(1, 6))
    assert checker._collect(mine, keys, calls) and calls[1].group_seq == 6


def test_a_peer_already_past_this_call_is_no_deadlock_and_its_payload_is_read(checker, tmp_path):
    tracer = Tracer(tmp_path)
    tracer._group_seq["0"] = 6
    mine = call(0, 6)
    _publish(checker, call(1, 6))  # it published call 6, read this rank's, went on:
    _publish(checker, call(1, 7))  # its last call is now 7, beyond this rank's 6
    calls = {0: mine}
    assert checker._crossed_wait(mine, {1: checker._key("0", 0, 1)}, calls, tracer) is None
    assert calls[1].group_seq == 6


def test_a_peer_blocked_in_another_groups_call_this_rank_has_not_issued_is_a_deadlock(checker, tmp_path):
    tracer = Tracer(tmp_path)
    tracer._group_seq["0"] = 6
    mine = call(0, 6)
    _publish(checker, call(1, 3, group="1"))
    div = checker._crossed_wait(mine, {1: checker._key("0", 0, 1)}, {0: mine}, tracer)
    assert div is not None and "a certain deadlock" in div.source
    assert {div.call_a.group, div.call_b.group} == {"0", "1"}
