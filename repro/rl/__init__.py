"""RL math with verl's semantics: advantages, policy and value losses, KL, the step's metrics, MFU.

``algorithms`` (masked statistics, loss aggregation, GRPO/GAE, clipped policy and value losses, KL
penalties: verl's ``core_algos`` is the oracle, ``nox -s verl``), ``advantages`` and
``policy_losses`` (the registries of verl's estimator and loss names), ``step`` (the driver's
rewards, in-reward KL controller and batch metrics), ``metrics`` (metric names, the TSV log,
summaries, curves), ``validation_metrics`` and ``mfu``. Pure torch: may import ``batching``,
``rewards`` and ``config``, nothing that starts a process.
"""
