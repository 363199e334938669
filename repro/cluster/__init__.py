"""Processes, ranks and nodes: Ray worker groups, placement, process groups, signals, worker errors.

``worker_group`` (one Ray actor per rank, rank env, reuse), ``placement`` (bundles across nodes,
checked against the live cluster), ``shared_storage`` (run folders reachable from every node),
``process_group`` (torch.distributed and deepspeed.comm start-up), ``rank_reset`` (a kept rank made
fresh), ``signals`` (SIGTERM as Ctrl-C around Ray), ``errors`` (a rank's exception, told once).
May import ``devices``, ``collectives``, ``config`` and ``rl``; not ``run``, ``workers`` or above.
"""
