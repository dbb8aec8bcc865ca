"""The packed PS transport: one message per PS rank per operation (docs/design.md section 12).

Across hosts, MPI one-sided operations on scattered rows cost per row, not
per byte (OpenMPI through UCX over TCP splits an indexed datatype into one
remote operation per block). Here a worker packs everything one operation
sends to one PS rank into a single contiguous message, and the PS rank,
which owns the rows in its window memory, applies it:

- ``pull``: the worker sends the shard-local row ids (int64); the PS
  gathers the rows and sends them back as one ``[n, dim]`` block;
- ``put`` / ``accumulate``: the worker sends ids and values in one buffer
  (``n`` int64 ids, then ``n * dim`` values); the PS overwrites or adds them
  (``hybrid._ext.row_kernels``) and answers with an empty acknowledgement;
- HET's versions (one int64 per row, when the store keeps them) are read
  and added the same way, under tags of their own;
- with a 16-bit wire (docs/design.md section 14) rows and values travel as
  bfloat16 bits under kinds of their own (``PULL16``, ``PUT16``, ``ADD16``):
  the PS rounds the rows it sends and widens the values it receives into
  its master rows, so a message carries half the bytes;
- a column slice of ``width`` values per row (a shard plan's slice) travels
  with ``width`` in the tag above the kind (``kind | width << 4``), and the PS
  addresses its shard as rows of that width.

A handle completes when its replies have arrived, so a completed write is in
the PS's memory: the ordering rules of section 11 hold as they do with
``Flush``. Messages between a worker and a PS rank use one tag per kind on a
communicator of their own; MPI's non-overtaking rule matches replies to
requests in order. PS ranks serve inside :meth:`PsService.serve_until`,
which the store's collective ``barrier()`` runs while everyone else waits.
"""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from hybrid._ext import row_kernels

PULL, ROWS, PUT, ADD, DONE, VERSION_PULL, VERSIONS, VERSION_ADD = 1, 2, 3, 4, 5, 6, 7, 8
PULL16, PUT16, ADD16 = 9, 10, 11  # the same, rows and values as bfloat16 bits
_KIND_BITS = 4  # a tag's low bits: the kind; above them the column slice's width (0: whole rows)
_IDLE_SLEEP_SECONDS = 0.00005


def write_kind(add: bool, sixteen: bool) -> int:
    """The kind of a write message: an addition or an overwrite, in 16 bits or the rows' own precision."""
    if add:
        return ADD16 if sixteen else ADD
    return PUT16 if sixteen else PUT


def request_pull(channel: MPI.Comm, target: int, local_rows: np.ndarray, staging: np.ndarray,
                 versions: bool = False, width: int = 0, sixteen: bool = False) -> tuple[list, np.ndarray]:
    """Start reading ``local_rows`` of ``target``'s shard (or their versions) into ``staging``;
    returns the requests and the id buffer. ``width``: a column slice's (rows of that width);
    ``sixteen``: the rows as bfloat16 bits (``staging`` is uint16)."""
    ids = np.ascontiguousarray(local_rows, dtype=np.int64)
    reply = channel.Irecv(staging, source=target, tag=VERSIONS if versions else ROWS)
    kind = VERSION_PULL if versions else PULL16 if sixteen else PULL
    request = channel.Isend([ids, MPI.BYTE], dest=target, tag=kind | width << _KIND_BITS)  # PS gets bytes
    return [reply, request], ids


def request_write(channel: MPI.Comm, target: int, local_rows: np.ndarray, values: np.ndarray,
                  positions: np.ndarray, tag: int, width: int = 0, sixteen: bool = False) -> tuple[list, np.ndarray]:
    """Start writing ``values[positions]`` to ``local_rows`` of ``target``'s shard; returns the requests and the buffer.

    ``width``: a column slice's (``values`` are the slice's columns, rows of that width at the PS);
    ``sixteen``: the values go as bfloat16 bits (``tag`` a 16-bit kind)."""
    n, dim = len(local_rows), values.shape[1]
    packed = np.empty(n * 8 + n * dim * (2 if sixteen else values.itemsize), dtype=np.uint8)
    packed[:n * 8].view(np.int64)[:] = local_rows
    if sixteen:
        row_kernels.encode_bf16(np.take(values, positions, axis=0).reshape(-1), packed[n * 8:].view(np.uint16))
    else:
        np.take(values, positions, axis=0, out=packed[n * 8:].view(values.dtype).reshape(n, dim))
    done = channel.Irecv([None, 0, MPI.BYTE], source=target, tag=DONE)
    return [done, channel.Isend([packed, MPI.BYTE], dest=target, tag=tag | width << _KIND_BITS)], packed


# a write kind: the kernel that applies it, and its values' type (None: the shard's)
_WRITES = {PUT: (row_kernels.put_rows, None), ADD: (row_kernels.add_rows, None),
           PUT16: (row_kernels.put_rows_bf16, np.dtype(np.uint16)),
           ADD16: (row_kernels.add_rows_bf16, np.dtype(np.uint16))}


class PsService:
    """A PS rank's side: answers the workers' packed messages against ``shard``.

    After a message it keeps probing for ``spin_seconds`` (the next one
    usually follows within the same phase), then sleeps between probes; with
    more ranks than cores, ``spin_seconds=0`` leaves the cores to the workers.
    """

    def __init__(self, channel: MPI.Comm, shard: np.ndarray, spin_seconds: float = 0.002,
                 versions: np.ndarray | None = None):
        self.channel, self.shard, self.spin_seconds = channel, shard, spin_seconds
        self.versions = versions  # HET: the shard's row versions (int64), or None
        self._replies: list = []  # (request, buffer) of replies in flight

    def serve_until(self, done: MPI.Request) -> None:
        """Answer messages until ``done`` completes (a barrier the workers enter once their handles are complete)."""
        status = MPI.Status()
        idle_since = time.perf_counter()
        while True:
            message = self.channel.Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)
            if message is not None:
                self._answer(message, status)
                idle_since = time.perf_counter()
                continue
            if self._replies:
                # A large reply moves only while this rank calls into MPI: never sleep while one is in flight.
                self._reap()
                continue
            if done.Test():
                break
            if time.perf_counter() - idle_since > self.spin_seconds:
                time.sleep(_IDLE_SLEEP_SECONDS)  # ranks may share cores: do not take theirs while idle

    def _answer(self, message: MPI.Message, status: MPI.Status) -> None:
        source, tag, size = status.Get_source(), status.Get_tag(), status.Get_count(MPI.BYTE)
        tag, width = tag & ((1 << _KIND_BITS) - 1), tag >> _KIND_BITS
        shard = self.shard.reshape(-1, width) if width else self.shard  # a column slice: rows of its width
        if tag in (PULL, PULL16):
            ids = np.empty(size // 8, dtype=np.int64)
            message.Recv([ids, MPI.BYTE])
            sixteen = tag == PULL16
            rows = np.empty((len(ids), shard.shape[1]), dtype=np.uint16 if sixteen else shard.dtype)
            (row_kernels.gather_rows_bf16 if sixteen else row_kernels.gather_rows)(shard, ids, rows)
            self._replies.append((self.channel.Isend(rows, dest=source, tag=ROWS), rows))
        elif tag in _WRITES:
            packed = np.empty(size, dtype=np.uint8)
            message.Recv([packed, MPI.BYTE])
            apply, dtype = _WRITES[tag]
            dtype = dtype or shard.dtype
            n = size // (8 + shard.shape[1] * dtype.itemsize)
            ids = packed[:n * 8].view(np.int64)
            apply(shard, ids, packed[n * 8:].view(dtype).reshape(n, shard.shape[1]))
            self._replies.append((self.channel.Isend([None, 0, MPI.BYTE], dest=source, tag=DONE), None))
        elif tag == VERSION_PULL and self.versions is not None:
            ids = np.empty(size // 8, dtype=np.int64)
            message.Recv([ids, MPI.BYTE])
            found = self.versions[ids].reshape(-1, 1)
            self._replies.append((self.channel.Isend(found, dest=source, tag=VERSIONS), found))
        elif tag == VERSION_ADD and self.versions is not None:
            packed = np.empty(size, dtype=np.uint8)
            message.Recv([packed, MPI.BYTE])
            ids, counts = packed.view(np.int64).reshape(2, -1)
            np.add.at(self.versions, ids, counts)
            self._replies.append((self.channel.Isend([None, 0, MPI.BYTE], dest=source, tag=DONE), None))
        else:
            raise RuntimeError(f"PS rank {self.channel.rank}: unexpected message tag {tag} from rank {source}")

    def _reap(self) -> None:
        """Drop the replies that have left."""
        if self._replies and MPI.Request.Testall([r for r, _ in self._replies]):
            self._replies.clear()
