"""Checkpoint directory rules of repro.workers.checkpoint that need no DeepSpeed engine.

``load`` checks the directory (complete? same dp? same ZeRO stage?) before it touches the
engine, so these refusals are tested on plain directories; the engine paths are covered by
tests/distributed/workers/test_checkpoint.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from repro.workers import checkpoint


def _complete(root: Path, step: int, dp: int = 1, stage: int = 2) -> Path:
    d = root / f"actor_{step}"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"step": step, "dp": dp, "zero_stage": stage}))
    return d


def _engine(stage: int = 2) -> SimpleNamespace:
    return SimpleNamespace(ds=SimpleNamespace(zero_stage=stage))


def test_missing_checkpoint_error_names_the_path(tmp_path):
    with pytest.raises(ValueError, match=str(tmp_path / "actor_9")):
        checkpoint.load(_engine(), str(tmp_path / "actor_9"))


def test_corrupt_meta_error_names_the_file(tmp_path):
    d = _complete(tmp_path, 2)
    (d / "meta.json").write_text("{not json")
    with pytest.raises(ValueError, match="meta.json is corrupt"):
        checkpoint.load(_engine(), str(d))


def test_different_dp_is_refused_naming_both_sizes(tmp_path):
    d = _complete(tmp_path, 2, dp=2)
    with pytest.raises(ValueError, match=r"saved with dp=2 .* this run has dp=1"):
        checkpoint.load(_engine(), str(d))


def test_different_zero_stage_is_refused(tmp_path):
    d = _complete(tmp_path, 2, stage=3)
    with pytest.raises(ValueError, match="ZeRO-3 but this run uses ZeRO-2"):
        checkpoint.load(_engine(2), str(d))


def test_config_digest_is_stable_and_sensitive():
    from repro.config import RunConfig

    a, b = RunConfig(), RunConfig()
    assert checkpoint.config_digest(a) == checkpoint.config_digest(b)
    b.actor_rollout_ref.actor.optim.lr = 3e-4
    assert checkpoint.config_digest(a) != checkpoint.config_digest(b)
