"""Batch plans for the DeepSpeed config tests, built by hand (no RunConfig, no world).

Shared by ``test_ds_config.py`` and ``test_zero3.py``; it lives here because test modules never
import each other (``tests/unit/test_test_layout.py``).
"""

from __future__ import annotations

from repro.batching.plan import RoleBatchPlan


def role_plan(dp: int, mini_samples: int, micro: int, samples_per_step: int) -> RoleBatchPlan:
    """The plan of ``dp`` ranks without sequence parallelism: mini-batches of ``mini_samples`` split
    evenly over the ranks, ``micro`` samples per micro-batch, fixed-size batches."""
    per_rank = mini_samples // dp
    return RoleBatchPlan(
        world=dp, dp=dp, sp=1, samples_per_step=samples_per_step, mini_batch_samples=mini_samples,
        per_rank_mini=per_rank, micro=micro, gas=per_rank // micro, train_batch_size=mini_samples,
        num_mini_batches=samples_per_step // mini_samples, dynamic=False, max_token_len=None,
    )


BENCH_PLAN = role_plan(dp=2, mini_samples=16, micro=2, samples_per_step=16)  # micro 2, GAS 4, 2 ranks
