"""Launch: start N local ranks of a script or module with tracing on, and watch them for a stall.

``launcher`` (the torchrun-like launcher behind ``launch``: the ranks' command lines and
environment, ending the rest when one fails, the ranks' own exceptions from their logs) and
``stall`` (the hang watch over the ranks' records, the stack dump signal, and Flight Recorder
dumped live by every rank under ``run``). Reads the records only through
:mod:`repro.collectives.events`; may import nothing else of the trace tool (the command line puts
launching and analysing together).
"""
