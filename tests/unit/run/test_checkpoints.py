"""The checkpoint store on real files: manifest, verification, fallback past damage, pruning.

Checkpoints here are made of plain files shaped like the trainer's (``actor/ds/...`` shards,
``critic/...``, ``trainer_state.json``); the same store on real DeepSpeed checkpoints through the
trainer is tests/e2e/test_run_safety.py's damaged-checkpoint check.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.run.checkpoints import MANIFEST, MARKER, CheckpointStore, file_digest

SHARD = "actor/ds/ckpt/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"
FILES = {SHARD: 4096, "actor/rank0_state.pt": 300, "actor/meta.json": 40, "critic/ds/ckpt/model.pt": 2048,
         "trainer_state.json": 60}


def _save(store: CheckpointStore, step: int, keep=None, parts=("actor", "critic")):
    stage = store.begin(step)
    for rel, size in FILES.items():
        if rel.split("/")[0] in parts or "/" not in rel:
            path = stage / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(size))
    return store.commit(step, keep=keep)


@pytest.fixture
def store(tmp_path):
    s = CheckpointStore(tmp_path / "checkpoints")
    for step in (2, 4):
        _save(s, step)
    return s


def test_manifest_lists_every_file_with_size_and_checksum(store):
    folder = store.path(4)
    man = json.loads((folder / MANIFEST).read_text())
    on_disk = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)
    assert sorted(man["files"]) == on_disk == sorted(FILES)
    for rel, entry in man["files"].items():
        assert entry["size"] == (folder / rel).stat().st_size
        assert entry["blake2b"] == file_digest(folder / rel)
    assert (store.root / MARKER).read_text() == "4\n"
    assert not store.staging(4).exists()


def test_intact_latest_is_resumed_without_notes(store):
    found = store.resume()
    assert (found.path, found.step, found.notes) == (store.path(4), 4, [])


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[7] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated DeepSpeed shard": (lambda d: _truncate(d / SHARD), SHARD),
    "changed shard, same size": (lambda d: _flip_byte(d / SHARD), SHARD),
    "missing rank state": (lambda d: (d / "actor/rank0_state.pt").unlink(), "actor/rank0_state.pt"),
    "truncated trainer_state.json": (lambda d: _truncate(d / "trainer_state.json"), "trainer_state.json"),
    "missing manifest": (lambda d: (d / MANIFEST).unlink(), MANIFEST),
    "truncated manifest": (lambda d: _truncate(d / MANIFEST), MANIFEST),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_latest_falls_back_to_previous_and_is_kept_renamed(store, kind):
    damage, bad_name = DAMAGE[kind]
    damage(store.path(4))
    before = sorted(p.relative_to(store.path(4)).as_posix() for p in store.path(4).rglob("*"))
    found = store.resume()
    assert (found.path, found.step) == (store.path(2), 2)
    message = "\n".join(found.notes)
    assert "global_step_4" in message and bad_name in message and "resuming from global_step_2" in message
    kept = store.root / "global_step_4.damaged"
    assert found.set_aside == [kept] and not store.path(4).exists()
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*")) == before  # nothing deleted


def test_empty_marker_is_named_and_the_newest_intact_checkpoint_is_used(store):
    (store.root / MARKER).write_text("")
    found = store.resume()
    assert found.step == 4
    assert any(MARKER in n and "empty" in n for n in found.notes)


def test_marker_naming_a_damaged_step_falls_back_with_both_names(store):
    _truncate(store.path(4) / SHARD)
    (store.root / MARKER).write_text("")
    found = store.resume()
    assert found.step == 2
    message = "\n".join(found.notes)
    assert MARKER in message and SHARD in message


def test_every_checkpoint_damaged_means_none_and_all_kept(store):
    _truncate(store.path(4) / SHARD)
    (store.path(2) / "trainer_state.json").unlink()
    found = store.resume()
    assert found.path is None and found.step == 0
    assert sorted(p.name for p in store.root.iterdir() if p.is_dir()) == ["global_step_2.damaged",
                                                                            "global_step_4.damaged"]


def test_a_second_damage_of_the_same_step_gets_its_own_name(store):
    (store.path(4) / MANIFEST).unlink()
    store.resume()
    _save(store, 4)
    (store.path(4) / MANIFEST).unlink()
    store.resume()
    assert (store.root / "global_step_4.damaged").is_dir() and (store.root / "global_step_4.damaged.1").is_dir()


def test_explicit_check_names_the_bad_files(store):
    _truncate(store.path(4) / "trainer_state.json")
    with pytest.raises(ValueError, match=r"global_step_4 .*trainer_state.json \(size"):
        store.check(store.path(4))
    store.check(store.path(2))


def test_interrupted_save_is_never_complete_and_is_cleared_by_the_next_save(store):
    stage = store.begin(6)
    (stage / "trainer_state.json").write_text("{}")  # the kill comes before commit
    assert store.latest() == (store.path(4), 4) and store.resume().step == 4
    _save(store, 6)
    assert store.latest() == (store.path(6), 6) and not stage.exists()


def test_actor_and_critic_limits_both_hold(tmp_path):
    store = CheckpointStore(tmp_path)
    for step in range(1, 7):
        _save(store, step, keep={"actor": 2, "critic": 4})
    have = {part: sorted(s for s, f in store.step_folders().items() if (f / part).is_dir()) for part in ("actor", "critic")}
    assert have == {"actor": [5, 6], "critic": [3, 4, 5, 6]}
    assert sorted(store.step_folders()) == [3, 4, 5, 6]  # 1 and 2 lost every part: removed
    assert store.complete_steps() == [5, 6]  # a checkpoint without its actor cannot be resumed
    man = json.loads((store.path(3) / MANIFEST).read_text())
    assert man["pruned"] == ["actor"] and not any(k.startswith("actor/") for k in man["files"])
    assert store.verify(store.path(3)) == ["actor/ (pruned)"]
    assert store.resume().step == 6


def test_none_or_zero_keeps_everything(tmp_path):
    store = CheckpointStore(tmp_path)
    for step in range(1, 5):
        _save(store, step, keep={"actor": None, "critic": 0})
    assert store.complete_steps() == [1, 2, 3, 4]


def test_resumed_from_checkpoint_survives_until_a_newer_one_is_complete(store):
    _save(store, 6)
    (store.path(6) / MANIFEST).unlink()  # the run died while step 6 was being sealed
    found = store.resume()
    assert found.step == 4
    stage = store.begin(5)  # the resumed run dies again during its next save
    (stage / "trainer_state.json").write_text("{}")
    assert store.resume().step == 4 and (store.path(4) / MANIFEST).is_file()
    _save(store, 5, keep={"actor": 1, "critic": 1})
    assert store.complete_steps() == [5]  # only now, with step 5 complete, is step 4 pruned
    assert (store.root / "global_step_6.damaged").is_dir()  # pruning never touches set-aside folders


def test_pruning_keeps_the_new_save_even_when_an_older_timeline_has_higher_steps(store):
    _save(store, 8)
    # resume_path to step 2, then a new save at step 3: the abandoned step 8 is older by commit order
    _save(store, 3, keep={"actor": 1, "critic": 1})
    assert store.complete_steps() == [3]


@settings(max_examples=15, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(1, 30), st.sampled_from(["save", "crash", "damage"])), min_size=1, max_size=12),
       keep_actor=st.integers(1, 4), keep_critic=st.integers(1, 4))
def test_any_history_keeps_limits_and_resumes_the_last_intact_commit(tmp_path_factory, ops, keep_actor, keep_critic):
    store = CheckpointStore(tmp_path_factory.mktemp("store"))
    last_good = None
    for step, op in ops:
        if op == "crash":
            store.begin(step)
            continue
        path = _save(store, step, keep={"actor": keep_actor, "critic": keep_critic})
        last_good = step
        if op == "damage":
            _truncate(path / SHARD)
            found = store.resume()
            last_good = found.step or None
    folders = store.step_folders()
    assert sum((f / "actor").is_dir() for f in folders.values()) <= keep_actor
    assert sum((f / "critic").is_dir() for f in folders.values()) <= keep_critic
    found = store.resume()
    if last_good is not None and (store.path(last_good) / "actor").is_dir():
        assert found.step == last_good
    assert found.path is None or store.verify(found.path) == []
