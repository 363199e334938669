"""Benchmarks of the DeepSpeed backend; each runner is a module with its own CLI.

- ``python -m repro.bench.workers``: ``update_policy`` throughput and peak memory per ZeRO case,
  next to a bare DeepSpeed engine loop on the same model and batch.
"""
