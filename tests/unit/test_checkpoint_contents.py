"""``checkpoint.save_contents`` / ``load_contents``: verl's keys either work or are refused by key.

DeepSpeed writes model and optimizer (with the LR scheduler) in one call and repro's ``extra``
(RNG states, data position, update counter) is what makes a resume exact, so both lists must hold
those three; ``hf_model`` adds a Hugging Face export to each save (exercised on real checkpoints
in tests/e2e/test_run_safety.py's damaged-checkpoint check) and cannot be loaded (verl does not load it either).
"""

from __future__ import annotations

import pytest

from repro.config.loader import load_config
from repro.main_ppo import main

SECTIONS = ("actor_rollout_ref.actor.checkpoint", "critic.checkpoint")
REFUSED = {
    "save_contents=[model]": "must include ['optimizer', 'extra']",
    "save_contents=[model,optimizer]": "must include ['extra']",
    "save_contents=[model,optimizer,extra,weights]": "'weights' is not valid; choose one of ['model', 'optimizer', 'extra', 'hf_model']",
    "load_contents=[model]": "must include ['optimizer', 'extra']",
    "load_contents=[model,optimizer,extra,hf_model]": "'hf_model' is not valid; choose one of ['model', 'optimizer', 'extra']",
}


def _load(argv):
    return load_config(["trainer.device=cpu", *argv], config_name="ppo_trainer")


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize("override", sorted(REFUSED))
def test_partial_or_unknown_contents_are_refused_naming_the_key(section, override):
    key = f"{section}.{override.split('=')[0]}"
    with pytest.raises(ValueError) as err:
        _load([f"{section}.{override}"])
    assert key in str(err.value) and REFUSED[override] in str(err.value), str(err.value)


@pytest.mark.parametrize("section", SECTIONS)
def test_hf_model_in_save_contents_is_accepted(section):
    cfg = _load([f"{section}.save_contents=[model,optimizer,extra,hf_model]"])
    node = cfg.actor_rollout_ref.actor if section.startswith("actor") else cfg.critic
    assert node.checkpoint.save_contents == ["model", "optimizer", "extra", "hf_model"]


def test_the_command_line_exits_2_with_one_line(capsys):
    code = main(["-cn", "ppo_tiny", "trainer.device=cpu", "trainer.dry_run=true", "critic.checkpoint.save_contents=[model]"])
    err = capsys.readouterr().err
    assert code == 2 and "critic.checkpoint.save_contents" in err and "Traceback" not in err
