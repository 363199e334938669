"""Layouts give the same step: step 1 of the actor in every layout, against the same step on one rank.

One table (``LAYOUTS`` in ``layout_table.py``, shared with the 2-GPU test
``tests/gpu_e2e/test_layout_parity_gpu.py``): ZeRO-1/2/3 at dp=2, Ulysses sp=2, fixed and token-budget
micro-batches, padded and packed (remove-padding) rows, each on 2 gloo ranks of the warm rank pool; and
the seed's dp=2 x sp=2 (``LAYOUTS_DP2_SP2``) on 4 fresh gloo ranks. The
baseline is the same ``ActorWorker`` on one rank, padded, fixed micro-batches. Compared: the
step's entropy (what the trainer reports from ``compute_log_prob``), its policy and KL losses
(the ranks' metrics reduced as the driver reduces them) and DeepSpeed's grad norm, each within a
bound derived in ``layout_table.bounds``. Every 2-rank layout runs in the same two rank processes (one pool task; the
baseline is a second, one-rank task), so the table costs two engine builds' start-up, not one per
row. Each row also reads back that it ran the layout it names (``RoleEngine.report``: ZeRO stage,
SP group, mask-free packed rows), so a layout silently falling back to another cannot pass.

These tables are the one place where layouts are compared with each other at step 1 (it replaces
the bare-DeepSpeed ZeRO-1/2/3 loss and grad-norm smoke test); the deeper per-feature checks stay
with their features (every gradient element, later steps, the weights: ``test_zero_parity.py``,
``test_remove_padding.py``, ``test_ulysses.py``, ``test_batch_splits.py``).
"""

from __future__ import annotations

from tests.distributed.workers.helpers import make_model_dir
from tests.distributed.workers.layout_table import LAYOUTS, LAYOUTS_DP2_SP2, ONE_RANK, check, step_one
from tests.multirank import run_ranks


def test_step_one_is_the_same_in_every_layout(pooled, tmp_path):
    model_dir = make_model_dir(tmp_path / "model")
    two = pooled(step_one, 2, timeout_s=300, args=(model_dir, list(LAYOUTS.values())))
    one = pooled(step_one, 1, timeout_s=120, args=(model_dir, [ONE_RANK]))
    lines = check(two, one, model_dir)
    print("\nstep 1 against one rank (|diff| / bound):\n" + "\n".join(lines))


def test_step_one_at_dp2_x_sp2_on_four_ranks_is_the_same_as_on_one(pooled, tmp_path):
    """The seed's 4-GPU layout (dp=2 x sp=2) on 4 gloo ranks, fresh ones (the warm pool holds 2): the
    SP groups' gathers and the dp all-reduce across them, against the same one-rank step."""
    model_dir = make_model_dir(tmp_path / "model")
    four = run_ranks(step_one, 4, tmp_path=tmp_path, timeout_s=300, args=(model_dir, list(LAYOUTS_DP2_SP2.values())))
    one = pooled(step_one, 1, timeout_s=120, args=(model_dir, [ONE_RANK]))
    lines = check(four, one, model_dir, LAYOUTS_DP2_SP2)
    print("\nstep 1 on 4 ranks against one rank (|diff| / bound):\n" + "\n".join(lines))
