"""Analyze: per-rank records in, the first divergence out, as text, JSON or a Chrome trace.

``align`` (the :class:`~repro.collectives.analyze.align.Divergence` and the per-group alignment
that finds the first one), ``findings`` (``analyze(dir)``: every finder in order - the live
check's own failure, the alignment, point-to-point pairs, all-to-all split sizes, Flight Recorder
dumps beside the records, a missing rank, a call that never returned), ``report`` (the text for
people, the JSON for tools) and ``formats`` (Flight Recorder dumps read in, Chrome / Perfetto
trace events written out). Works on records only, so it runs anywhere, after the job: may import
:mod:`repro.collectives.events` and :mod:`repro.collectives.callsite`, nothing that records,
checks or launches.
"""
