"""repro.rl.validation_metrics: verl's val-core / val-aux layout (values checked against verl in tests/verl_parity)."""

from __future__ import annotations

import pytest

from repro.rl.validation_metrics import subset_sizes, validation_metrics


@pytest.mark.parametrize(("n", "sizes"), [(1, []), (2, [2]), (4, [2, 4]), (5, [2, 4, 5]), (9, [2, 4, 8, 9])])
def test_bootstrap_subset_sizes_are_powers_of_two_below_n_then_n(n, sizes):
    assert subset_sizes(n) == sizes


def test_one_sample_per_prompt_gives_only_the_core_mean():
    out = validation_metrics(["arith", "arith", "gsm8k"], [0, 1, 2], {"reward": [1.0, 0.0, 0.5]})
    assert out == {"val-core/arith/reward/mean@1": 0.5, "val-core/gsm8k/reward/mean@1": 0.5}


def test_core_holds_mean_and_best_at_the_largest_n_and_aux_the_rest():
    uids = [0] * 4 + [1] * 4
    out = validation_metrics(["arith"] * 8, uids, {"reward": [1.0] * 4 + [0.0, 0.0, 0.0, 1.0]})
    core = {k.split("/", 3)[3] for k in out if k.startswith("val-core/arith/reward/")}
    aux = {k.split("/", 3)[3] for k in out if k.startswith("val-aux/arith/reward/")}
    assert core == {"mean@4", "best@4/mean", "best@4/std"}
    assert aux == {"std@4", "best@2/mean", "best@2/std", "worst@2/mean", "worst@2/std", "worst@4/mean", "worst@4/std"}
    assert out["val-core/arith/reward/mean@4"] == pytest.approx(0.625)
    # Prompt 0 always scores 1, so its best and worst are 1. Prompt 1 has one 1 in 4: its best of 4
    # draws is 1 with probability 1 - (3/4)^4, its worst is 1 with probability (1/4)^4.
    assert out["val-core/arith/reward/best@4/mean"] == pytest.approx(0.5 + 0.5 * (1 - 0.75**4), abs=0.03)
    assert out["val-aux/arith/reward/worst@4/mean"] == pytest.approx(0.5 + 0.5 * 0.25**4, abs=0.03)
