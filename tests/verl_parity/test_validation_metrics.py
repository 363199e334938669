"""repro.rl.validation_metrics against verl 0.9.1's validation metrics, key for key.

verl's trainer turns a validation pass into metrics with ``process_validation_metrics`` and
``RayPPOTrainer._val_metrics_update`` (which uses nothing of the trainer; called unbound here).
Inputs: prompts with any number of samples (one included, so no bootstrap; 9, so sizes 2, 4, 8, 9),
in any order, over two data sources, with the score variable ``reward`` and sometimes an ``acc``
variable (which then is the core one) that may miss some samples (``None``).
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st
from verl.trainer.ppo.metric_utils import process_validation_metrics
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from repro.rl.validation_metrics import validation_metrics
from tests.verl_parity.inputs import close

SCORES = st.sampled_from([0.0, 0.1, 1.0, -0.5, 0.75])


@st.composite
def validation_passes(draw):
    counts = draw(st.lists(st.integers(1, 9), min_size=1, max_size=3))
    samples = [(uid, draw(st.sampled_from(["arith", "gsm8k"])) if j == 0 else None)
               for uid, n in enumerate(counts) for j in range(n)]
    source_of = {uid: src for uid, src in samples if src is not None}
    order = draw(st.permutations(range(len(samples))))
    uids = [samples[i][0] for i in order]
    sources = [source_of[u] for u in uids]
    variables = {"reward": [draw(SCORES) for _ in uids]}
    if draw(st.booleans()):
        variables["acc"] = [draw(st.one_of(st.none(), st.sampled_from([0.0, 1.0]))) for _ in uids]
    return sources, [f"uid-{u}" for u in uids], variables


@given(case=validation_passes())
def test_validation_metrics_equal_verls_key_for_key(case):
    sources, uids, variables = case
    ours = validation_metrics(sources, uids, variables)
    nested = process_validation_metrics(sources, uids, {k: list(v) for k, v in variables.items()})
    theirs = RayPPOTrainer._val_metrics_update(None, sources, uids, variables, [])
    assert nested  # verl computed something to compare with
    assert sorted(ours) == sorted(theirs)
    for key, value in theirs.items():
        close(ours[key], torch.tensor(float(value), dtype=torch.float64))
