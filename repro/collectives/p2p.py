"""Point-to-point pairing: per-pair sequence numbers, the live pairing check, and record-mode pairing.

Every send-side op (``send``, ``isend``, a send in ``batch_isend_irecv``, ``send_object_list``)
from rank S to rank D is numbered on the channel S->D; every receive-side op of D from S is
numbered on the same channel. The n-th send and the n-th receive of a channel are one transfer,
as both backends pair them in posting order (tags aside). A call record carries its ops as
``pairs`` items ``[role, peer, seq, numel, dtype, op]``.

Check mode publishes each item under ``<session>/p2p/<S>-<D>/<seq>/<role>`` and, before a
blocking op (or an async op's ``wait``) transfers, waits for the counterpart's key and compares
numel and dtype: a mismatch raises on both ranks with both call sites. While it waits it reads
the peer's published blocking call: a peer blocked on an op of this rank that this rank has not
posted (the recv-recv and send-send cycles, or a p2p against a collective) is a certain deadlock,
reported at once.

A receive from any source (``recv``/``irecv`` with ``src=None``) names no channel until it
completes: torch then tells the sender (``recv`` returns it, an ``irecv``'s work has
``_source_rank()``), and :func:`learn_source` numbers the receive on that channel, writes a
``source`` event (read back into the call's ``peer`` and ``pairs``) and, in check mode, publishes
it and compares it with the send it received. A blocking any-source receive publishes itself as
the call its rank is blocked in; a sender that finds its receiver there stops waiting for a
counterpart key that only the transfer can produce (the receiver compares the pair afterwards).
In the records, a send that no receive of its channel matches while its receiver went on
elsewhere is reported by :func:`unreceived` (an extra send, or one sent to the wrong peer).
"""

from __future__ import annotations

from typing import Any

from repro.collectives.events import CallRecord, channel, is_any_source

ROLE = {
    "send": "send",
    "isend": "send",
    "send_object_list": "send",
    "recv": "recv",
    "irecv": "recv",
    "recv_object_list": "recv",
}
BLOCKING = frozenset({"send", "recv", "send_object_list", "recv_object_list", "batch_isend_irecv"})


class PairCounter:
    """Per-channel numbering of one rank's point-to-point ops."""

    def __init__(self) -> None:
        self._posted: dict[tuple[str, int, int], int] = {}

    def number(self, role: str, me: int, peer: int | None) -> int | None:
        if peer is None:
            return None
        key = (role, *channel(role, me, peer))
        self._posted[key] = n = self._posted.get(key, 0) + 1
        return n

    def posted(self, role: str, src: int, dst: int) -> int:
        return self._posted.get((role, src, dst), 0)


def learn_source(tracer: Any, rec: CallRecord, source: int) -> None:
    """An any-source receive completed from global rank ``source``: number it on that channel."""
    if source < 0 or not rec.pairs or not is_any_source(rec.pairs[0]):
        return
    with tracer._lock:
        seq = tracer.pairs.number("recv", rec.rank, source)
        rec.pairs[0] = ["recv", source, seq, *rec.pairs[0][3:]]
        rec.peer = source
        tracer.write_event({"ev": "source", "index": rec.index, "peer": source, "seq": seq})
    if tracer.checker is not None:
        tracer.checker.check_p2p(rec, tracer, block=False)
