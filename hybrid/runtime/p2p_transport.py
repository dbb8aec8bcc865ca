"""Herald's P2P plans in the runtime: dirty rows sent cache to cache (docs/design.md section 5).

In P2P mode a row that is dirty on worker ``w`` at the end of ``t`` and
needed in ``t + 1`` by exactly one other worker ``v`` skips the PS: ``w``
sends it, ``v`` places it in its cache slot. Every worker's scheduler knows
every worker's events, so both sides know which rows move, in which order,
and where they land: only the values travel, one message per (sender,
receiver) pair per iteration.

The transfer is two-sided (``Isend``/``Irecv`` on the workers' own
communicator), not a one-sided ``Put`` into a window over the caches. A
one-sided write would need two barriers per iteration: the receiver's slot
may still hold a dirty row that it writes back in ``t + 1``, so the write
must wait until that write-back has copied the slot, and the receiver must
learn that the write landed. Here the sender copies its rows into the
message before it places anything of ``t + 1`` in its own cache, and the
receiver places them after its write-backs have copied their slots, like
a pull: no barrier, and one message per pair across hosts, where one-sided
operations on scattered rows cost per row (section 12).

With a 16-bit wire (section 14) a row travels as bfloat16 bits, and the
sender's own copy becomes the rounded row it sent: every copy of a row that
left a cache is the same value.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from hybrid.scheduling.plans import PeerTransfer
from hybrid.wire_format import Wire

TAG = 7


@dataclass
class Exchange:
    """The started sends and receives of one iteration; :meth:`complete` places what arrived."""

    wire: Wire = field(default_factory=Wire)
    requests: list = field(default_factory=list)
    arrivals: list = field(default_factory=list)  # (slots, buffer) to place in the cache
    keep: list = field(default_factory=list)  # send buffers, alive until the sends complete

    def complete(self, cache: np.ndarray) -> None:
        """Wait for every message, then write the received rows into their slots."""
        MPI.Request.Waitall(self.requests)
        for slots, values in self.arrivals:
            if self.wire.sixteen_bit:
                values = self.wire.decode(values, np.empty(values.shape, dtype=cache.dtype))
            cache[slots] = values
        self.requests, self.arrivals, self.keep = [], [], []


def start(channel: MPI.Comm, cache: np.ndarray, send: PeerTransfer, receive: PeerTransfer,
          wire: Wire = Wire()) -> Exchange:
    """Copy this worker's outgoing rows out of ``cache`` and start every send and receive.

    Call it before anything of the new iteration is placed in ``cache``
    (the sender's slots still hold the rows), and complete it after this
    worker's write-backs were issued (they copy the slots the rows land in).
    """
    exchange = Exchange(wire)
    on_wire = np.uint16 if wire.sixteen_bit else cache.dtype
    for peer in np.unique(receive.peers):
        mine = receive.peers == peer
        buffer = np.empty((int(mine.sum()), cache.shape[1]), dtype=on_wire)
        exchange.requests.append(channel.Irecv(buffer, source=int(peer), tag=TAG))
        exchange.arrivals.append((receive.slots[mine], buffer))
    for peer in np.unique(send.peers):
        slots = send.slots[send.peers == peer]
        values = np.ascontiguousarray(cache[slots])
        if wire.sixteen_bit:
            values = wire.encode(values)
            cache[slots] = wire.decode(values, np.empty((len(slots), cache.shape[1]), dtype=cache.dtype))
        exchange.requests.append(channel.Isend(values, dest=int(peer), tag=TAG))
        exchange.keep.append(values)
    return exchange
