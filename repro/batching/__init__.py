"""Batch semantics: the one padded RL batch type and how a step's samples become micro-batches.

``batch`` (the ``Batch``: a dict of equal-length tensors in verl's ``DataProto`` field names, with
select, shard and concat), ``plan`` (dp x sp splits, mini-batch, micro-batch and GAS, the errors
that name keys and nearest valid values) and ``token_budget`` (token-budget micro-batches, equal
counts across ranks). Imports nothing else of repro: the plan takes plain numbers, and
``repro.config.rules.plan_role_batch`` feeds it a run's keys.
"""
