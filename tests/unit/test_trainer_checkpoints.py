"""Which checkpoint the trainer resumes from, decided on real files before any worker starts.

``PPOTrainer.verified_checkpoint`` needs only the config and the run paths, so the trainer is
built without its data and tokenizer here; loading the chosen checkpoint into real engines is
tests/e2e/test_run_safety.py's damaged-checkpoint check.
"""

from __future__ import annotations

import json

import pytest

from repro.config import RunConfig
from repro.run.checkpoints import CheckpointStore
from repro.run.paths import RunPaths
from repro.trainer import PPOTrainer


def _trainer(tmp_path, **trainer) -> PPOTrainer:
    cfg = RunConfig()
    for k, v in trainer.items():
        setattr(cfg.trainer, k, v)
    t = PPOTrainer.__new__(PPOTrainer)
    resumed = trainer.get("resume_from_path")
    t.cfg = cfg
    t.paths = RunPaths(run_dir=tmp_path, ckpt_dir=tmp_path / "checkpoints",
                       resumed_from=None if resumed is None else tmp_path / resumed, resume_step=0)
    return t


@pytest.fixture
def store(tmp_path):
    s = CheckpointStore(tmp_path / "checkpoints")
    for step in (2, 4):
        stage = s.begin(step)
        (stage / "actor").mkdir()
        (stage / "actor" / "shard.pt").write_bytes(b"x" * 100)
        (stage / "trainer_state.json").write_text(json.dumps({"step": step}))
        s.commit(step)
    return s


def test_auto_resume_falls_back_and_records_the_notes(tmp_path, store):
    (store.path(4) / "trainer_state.json").write_text('{"st')
    assert _trainer(tmp_path).verified_checkpoint() == store.path(2)
    notes = json.loads((tmp_path / "run.json").read_text())["resume_notes"]
    assert any("global_step_4" in n and "trainer_state.json" in n for n in notes)


def test_explicit_resume_path_to_a_damaged_checkpoint_is_refused_naming_the_file(tmp_path, store):
    (store.path(4) / "actor" / "shard.pt").write_bytes(b"y" * 100)
    trainer = _trainer(tmp_path, resume_mode="resume_path", resume_from_path="checkpoints/global_step_4")
    with pytest.raises(ValueError, match=r"global_step_4 is damaged or incomplete: actor/shard.pt \(checksum"):
        trainer.verified_checkpoint()
    assert store.path(4).is_dir()  # an explicit choice is refused, not moved


def test_resume_disabled_loads_nothing(tmp_path, store):
    assert _trainer(tmp_path, resume_mode="disable").verified_checkpoint() is None
