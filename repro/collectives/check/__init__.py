"""Check: before a call runs, the ranks compare it through the store and raise on a difference.

``checker`` (the check mode, :class:`~repro.collectives.check.checker.CollectiveMismatchError`, and
the fingerprint exchange of a group's collectives: two slots per group, crossed waits found while
waiting, a peer that never arrives named with its last call) and ``pairs`` (the same for
point-to-point ops: each send against its receive, deadlocks of blocked pairs). It is handed
each call by the recorder and reports with analyze's words: may import
:mod:`repro.collectives.analyze`, :mod:`repro.collectives.events` and
:mod:`repro.collectives.callsite`; nothing that records or launches.
"""
