"""Collective tracing internals behind :mod:`repro.collectives_trace`.

``events`` (the record model and per-rank files), ``callsite`` (which stack frame is the user's),
``ops`` (which functions, derived from torch's list), ``record`` (patching torch.distributed),
``functional`` (functional collectives, DTensor), ``work`` (async waits), ``p2p`` (send/recv
pairing), ``splits`` (all-to-all split sizes), ``check`` (the live cross-rank fingerprint check),
``incomplete`` (missing records, calls that never returned), ``watch`` (the hang watch),
``live_fr`` (Flight Recorder read live, below the Python API),
``align`` and ``report`` (first divergence), ``flight_recorder`` (PyTorch FR dumps as input),
``chrome`` (timeline export), ``launch`` (the torchrun-like CLI launcher), ``active`` (the tracer slot) and
``session`` (start, stop, the env switch). Imports nothing else of repro; the trace tool
(``repro.collectives_trace``) and the process-group start-up (``repro.cluster``) import it.
"""
