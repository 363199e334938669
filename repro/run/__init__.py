"""A run on disk: its folder, claim and lock, preflight, resume check, interrupts, checkpoints.

``paths`` (where a run's files go, ``run.json``), ``claim`` and ``lock`` (one driver per run folder;
nothing a user wrote is overwritten or mixed with another run's), ``preflight`` (bad input: one
line, exit 2, before any worker starts), ``resume`` (what changed since the checkpoint),
``interrupts`` (what a stopped run records and how to continue it) and ``checkpoints`` (the
manifest-verified checkpoint layer every worker writes through). May import ``cluster`` and below.
"""
