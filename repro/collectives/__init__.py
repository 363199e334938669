"""Collective tracing internals behind :mod:`repro.collectives_trace`.

``events`` (the record model and per-rank files), ``callsite`` (which stack frame is the user's),
``record`` (patching torch.distributed), ``check`` (the live cross-rank fingerprint check),
``align`` and ``report`` (first divergence), ``flight_recorder`` (PyTorch FR dumps as input),
``chrome`` (timeline export), ``launch`` (the torchrun-like CLI launcher) and ``bench``.
"""
