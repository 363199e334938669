"""Record: every collective and point-to-point call of this process, written to its rank's file before it runs.

``session`` (start, stop, ``trace_collectives``, the ``REPRO_COLLECTIVES_*`` switch that a job's
process group calls, and installing every interception point), ``tracer`` (the active tracer:
the rank file, group and channel numbering, describing a call, the returns of async calls
posted from C++), ``ops`` (which functions are wrapped and how to read their arguments: groups,
dtypes, roles, split sizes), ``patches`` (torch.distributed's and DeepSpeed's Python functions,
async works and their waits, any-source receives), ``functional`` (functional collectives and
DTensor, eager and compiled) and ``native`` (what C++ issues at the dispatcher: DDP's reducer,
``ProcessGroup`` methods, and which mechanism issued it). Hands each call to the live check when
one is on: may import :mod:`repro.collectives.check`, :mod:`repro.collectives.analyze`,
:mod:`repro.collectives.events` and :mod:`repro.collectives.callsite`; not the launcher.
"""
