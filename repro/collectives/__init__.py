"""The collective trace tool behind :mod:`repro.collectives_trace`: four parts over one record model.

- ``record``: every collective and point-to-point call of a process, written to its rank's file
  before it runs - torch.distributed's and DeepSpeed's Python functions, functional collectives
  and DTensor, what C++ issues at the dispatcher (DDP's reducer), async waits; the session and
  its ``REPRO_COLLECTIVES_*`` switch.
- ``check``: before each call runs, the ranks of its group compare it through the store (and each
  send against its receive) and raise :class:`~repro.collectives.check.checker.CollectiveMismatchError`
  on a difference, a crossed wait or a peer that never arrives.
- ``analyze``: per-rank records (or Flight Recorder dumps) in, the first divergence out - the
  alignment, the other findings, text, JSON and Chrome / Perfetto output.
- ``launch``: N local ranks of a target with tracing on, and the stall watch that ends a hung job
  with every rank's stacks and Flight Recorder dumps.

``events`` (the record model: a call, its fingerprint, the per-rank files) and ``callsite``
(which stack frame is the user's line) are what all four share; ``cli`` is the command line
(``launch``, ``analyze``, ``export``, ``run``) over them. Imports point down this table only
(a part imports its own modules and lower layers; names on one layer are independent of each
other), and ``tests/unit/test_architecture.py`` reads it as it reads the one in
:mod:`repro`:

    layer  what                                          names
    0      the record model, call sites                  events callsite
    1      records in, the first divergence out          analyze
    2      the live check before each call               check
    3      recording a process; starting the ranks       record launch
    4      the command line                              cli

The tool imports nothing else of repro; the entry point (``repro.collectives_trace``) and the
process-group start-up (``repro.cluster.process_group``, through
``repro.collectives.record.session.install_from_env``) import it.
"""
