"""``checkpoint.save_contents`` / ``load_contents``: verl's keys either work or are refused by key.

DeepSpeed writes model and optimizer (with the LR scheduler) in one call and repro's ``extra``
(RNG states, data position, update counter) is what makes a resume exact, so both lists must hold
those three; ``hf_model`` adds a Hugging Face export to each save (exercised on real checkpoints
in tests/distributed/test_checkpoint_fallback.py) and cannot be loaded (verl does not load it either).
"""

from __future__ import annotations

import pytest

from repro.main_ppo import main

SECTIONS = ("actor_rollout_ref.actor.checkpoint", "critic.checkpoint")
REFUSED = {
    "save_contents=[model]": "must include ['optimizer', 'extra']",
    "save_contents=[model,optimizer]": "must include ['extra']",
    "save_contents=[model,optimizer,extra,weights]": "'weights' is not valid; choose one of ['model', 'optimizer', 'extra', 'hf_model']",
    "load_contents=[model]": "must include ['optimizer', 'extra']",
    "load_contents=[model,optimizer,extra,hf_model]": "'hf_model' is not valid; choose one of ['model', 'optimizer', 'extra']",
}


def _dry(argv, capsys):
    code = main(["-cn", "ppo_tiny", "trainer.device=cpu", "trainer.dry_run=true", *argv])
    return code, capsys.readouterr()


@pytest.mark.parametrize("section", SECTIONS)
@pytest.mark.parametrize("override", sorted(REFUSED))
def test_partial_or_unknown_contents_exit_2_naming_the_key(section, override, capsys):
    code, (out, err) = _dry([f"{section}.{override}"], capsys)
    key = f"{section}.{override.split('=')[0]}"
    assert code == 2
    assert key in err and REFUSED[override] in err, err


@pytest.mark.parametrize("section", SECTIONS)
def test_hf_model_in_save_contents_is_accepted(section, capsys):
    code, (out, err) = _dry([f"{section}.save_contents=[model,optimizer,extra,hf_model]"], capsys)
    assert code == 0, err
