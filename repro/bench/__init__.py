"""Benchmarks of the DeepSpeed backend.

- ``python -m repro.bench six-case|crossover``: the seed's six-case ZeRO benchmark and ZeRO-1/2
  crossover gate, each case a real training run (``rl_cases``), summarised by ``summary``.
- ``python -m repro.bench.workers`` (or ``python -m repro.bench workers``): ``update_policy``
  throughput and peak memory per ZeRO case, next to a bare DeepSpeed loop and FSDP2.
- ``python -m repro.bench.step_counts``: what one RL step's actor passes make the host and the network do per ZeRO
  case (host operators, Python calls, collectives), counted on 2 CPU ranks: the same on any machine.
"""
