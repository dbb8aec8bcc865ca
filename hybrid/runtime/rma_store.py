"""Embedding tables in MPI one-sided windows on the PS ranks (docs/design.md section 2).

PS ranks are passive: each allocates its shard of rows with
``MPI.Win.Allocate`` (displacement unit = one row) and otherwise only waits
in collectives. Workers read rows with ``Get``, write exclusive rows with
``Put`` and add shared gradients with ``Accumulate(op=SUM)``. Where each row
lives is a :class:`hybrid.runtime.shard_plan.ShardPlan`: by default contiguous ranges
of the global row space, or any plan ``hybrid plan-shards`` writes (whole
tables, row ranges, rows dealt round-robin).

A batched operation issues one RMA call per PS rank, whatever the number of
rows: the scattered target rows are described by one indexed datatype
(blocks of one row at the rows' displacements), the origin side is a
contiguous staging buffer (for whole rows on one PS rank, the caller's
array itself). Operations return a :class:`Handle`; ``wait()``
completes them (``Flush``) and, for reads, scatters the rows into place;
``complete(*handles)`` completes several with one ``Flush`` per PS rank.
Workers hold a shared passive-target epoch (``Lock_all``) for the store's
whole life; ``close()`` ends it and frees the window collectively.

Start-up follows a shard: each PS rank fills only its own rows, in place in
the window memory (``init(shard, runs)``, ``runs`` as
:meth:`ShardPlan.runs`), so its peak memory is the shard plus the process
itself, and all PS ranks initialize in parallel.

With a 16-bit :class:`~hybrid.wire_format.Wire` (``cluster.wire_precision``,
docs/design.md section 14) the rows a worker reads arrive rounded, and the
rows and deltas it writes are rounded before they leave, on both
transports: the packed transport sends bfloat16 bits (half the bytes) and
the PS converts them to and from its master rows; one-sided operations
cannot (an ``Accumulate`` adds values of the window's own type, and a
``Get`` reads them), so ``rma`` moves the rounded values at full width, on
the one host where it is chosen, and the model is the same. ``exact=True``
moves full precision on either: checkpoints, evaluations, the final flush
(what training sends is rounded; what only reads or saves the model is not).

With ``versions=True`` (HET, docs/design.md section 7) the PS ranks also
keep one int64 version per row in a second window, read with
:meth:`EmbeddingStore.read_versions` and added to with
:meth:`EmbeddingStore.add_versions`, through the same transport.

Two transports move the rows (docs/design.md section 12): ``rma``, the
one-sided operations above, for ranks that share memory, and ``packed``
(``hybrid.runtime.packed_transport``), one message per PS rank per operation that
the PS rank applies itself, for ranks on different hosts, where one-sided
operations on scattered rows cost per row. ``auto`` picks ``rma`` when every
rank is on one host. The PS ranks serve packed messages inside the
collective :meth:`EmbeddingStore.barrier`, which is where they wait out a
training run.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np
from mpi4py import MPI

from hybrid.runtime import packed_transport
from hybrid.runtime.comm import idle_barrier
from hybrid.runtime.shard_plan import ShardPlan
from hybrid.wire_format import Wire

_MPI_TYPES = {np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE}
TRANSPORTS = ("auto", "rma", "packed")
_MAX_MESSAGE_BYTES = 2**31 - 1  # MPI counts are C ints
_PAGE = 4096  # window sizes are rounded up to it (_padded)


def _padded(nbytes: int) -> int:
    """``nbytes`` rounded up to whole pages: the size to give ``MPI.Win.Allocate``.

    Under MPICH 4.0.2 (ch4:ucx) with the ranks on one host, two PS ranks'
    windows overlapped by 8 bytes: the first shard, 683,400 bytes (17,085
    float64 rows of 5), ended on the element where the second began, so
    whichever PS wrote it last won (tests/mpi/test_exactness.py, row-wise
    Adagrad on 2 PS ranks, either transport). Windows of whole pages did not
    overlap; the padding is never addressed.
    """
    return -(-nbytes // _PAGE) * _PAGE


def choose_transport(requested: str, comm: MPI.Comm) -> str:
    """``requested``, or for ``auto``: ``rma`` when every rank of ``comm`` shares one host, else ``packed``."""
    if requested not in TRANSPORTS:
        raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {requested!r}")
    if requested != "auto":
        return requested
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    one_host = node.size == comm.size
    node.Free()
    return "rma" if comm.allreduce(one_host, op=MPI.LAND) else "packed"


class Handle:
    """Outstanding store operations (one-sided or packed); ``wait()`` completes them.

    A plain class with slots: several are made every iteration.
    """

    __slots__ = ("store", "targets", "version_targets", "requests", "scatter", "buffers", "done", "rounded",
                 "decoded")

    def __init__(self, store: "EmbeddingStore"):
        self.store = store
        self.targets: list = []  # PS ranks to flush (rma)
        self.version_targets: list = []  # PS ranks to flush in the versions window (rma)
        self.requests: list = []  # messages to complete (packed)
        self.scatter: list = []  # (destination, positions, staging, columns) for reads
        self.buffers: list = []  # origin buffers MPI may read until the flush
        self.rounded: list = []  # read rows to round once landed (one-sided reads with a 16-bit wire)
        self.decoded: list = []  # (bfloat16 bits, values) of packed reads with a 16-bit wire, decoded once landed
        self.done = False

    def wait(self) -> None:
        self.store.complete(self)

    def _finish(self) -> None:
        """After the flush: round or decode read rows (16-bit wire), place them, release origin buffers."""
        for values in self.rounded:
            self.store.wire.round_(values)
        for bits, values in self.decoded:
            self.store.wire.decode(bits, values)
        for destination, positions, staging, columns in self.scatter:
            if columns is None:
                destination[positions] = staging
            else:  # column slices: each piece's row, at its own columns
                destination[positions[:, None], columns] = staging
        self.buffers.clear()
        self.done = True


class EmbeddingStore:
    """All embedding rows (``n_rows`` x ``dim``), sharded over ``ps_ranks`` of ``comm`` as ``plan`` says.

    Collective over ``comm`` (creation and :meth:`close`). ``init(shard,
    runs)`` fills ``shard`` (in the window memory) in place: local rows
    ``start ..`` of each run hold global rows ``first, first + stride, ..``
    (:meth:`ShardPlan.runs`); each PS rank calls it for its own shard.
    ``plan``: a :class:`ShardPlan` for ``n_rows`` rows on ``len(ps_ranks)``
    shards (default: contiguous ranges).
    ``transport``: ``auto``, ``rma`` or ``packed`` (see the module docstring);
    ``wire``: what training's transfers are rounded to (default: fp32, none);
    ``spin_seconds``: how long a PS rank keeps probing after a packed message
    before it sleeps between probes (0 when ranks share cores). With the
    packed transport PS ranks answer only inside :meth:`barrier` (and
    :meth:`close`): while workers use the store, that is the only collective
    the PS ranks may be in.
    """

    def __init__(self, comm: MPI.Comm, ps_ranks: Sequence[int], n_rows: int, dim: int, *,
                 dtype=np.float32, init: Optional[Callable[[np.ndarray, int], None]] = None,
                 transport: str = "auto", spin_seconds: float = 0.002, versions: bool = False,
                 plan: Optional[ShardPlan] = None, poll_seconds: Optional[float] = None,
                 wire: Optional[Wire] = None):
        self.comm, self.ps_ranks, self.dim = comm, list(ps_ranks), dim
        self.wire = wire or Wire()
        self.poll_seconds = poll_seconds  # a PS rank's sleep between polls in barrier() (None: comm.idle_barrier's)
        self.dtype = np.dtype(dtype)
        if self.dtype not in _MPI_TYPES:
            raise ValueError(f"dtype must be float32 or float64, got {self.dtype}")
        if not self.ps_ranks:
            raise ValueError("at least one PS rank is needed")
        self.transport = choose_transport(transport, comm)
        self.plan = ShardPlan.contiguous(n_rows, len(self.ps_ranks)) if plan is None else plan
        if self.plan.n_rows != n_rows or self.plan.n_shards != len(self.ps_ranks):
            raise ValueError(f"the shard plan places {self.plan.n_rows} rows on {self.plan.n_shards} shards; "
                             f"the store has {n_rows} rows on {len(self.ps_ranks)} PS ranks")
        if self.plan.columns and self.plan.dim != dim:
            raise ValueError(f"the shard plan slices width-{self.plan.dim} rows; the store's rows are {dim} wide")
        if self.plan.columns and versions:
            raise ValueError("HET's row versions need whole rows on one PS rank: use a plan without column slices")
        if self.transport == "packed" and self.plan.columns and self.dim >= 1 << 11:
            raise ValueError(f"column slices of width-{self.dim} rows do not fit a packed message's tag "
                             f"(widths below 2048): use transport rma or a plan without column slices")
        self.is_ps = comm.rank in self.ps_ranks
        self.row_bytes = dim * self.dtype.itemsize
        self.basic = _MPI_TYPES[self.dtype]
        self.row_type = self.basic.Create_contiguous(dim).Commit()
        self._slice_types: dict = {}  # column slices' row types, by width
        index = self.ps_ranks.index(comm.rank) if self.is_ps else -1
        size = int(self.plan.sizes[index]) if self.is_ps else 0
        try:
            self.win = MPI.Win.Allocate(_padded(size * self.row_bytes), disp_unit=self.row_bytes, comm=comm)
        except MPI.Exception as err:
            raise RuntimeError(
                f"cannot create the embedding window: MPI one-sided communication is unavailable with this "
                f"MPI's transport ({err.Get_error_string()}). On a TCP cluster with OpenMPI launch with "
                f"launch/mpirun.sh --tcp (UCX over TCP); see docs/design.md section 12") from err
        self.version_win = MPI.Win.Allocate(_padded(size * 8), disp_unit=8, comm=comm) if versions else None
        self.channel = comm.Dup() if self.transport == "packed" else None
        # one-sided operations on whole rows, the common case: one kernel call routes them (_get_whole, _write_whole)
        self._whole_rma = self.channel is None and not self.plan.columns
        self.service = None
        self.shard = None  # a PS rank's rows, in the window's memory
        self.versions = None  # a PS rank's row versions (HET), in the second window's memory
        if self.is_ps:
            memory = self.win.tomemory() if size else bytearray(0)
            shard = self.shard = np.frombuffer(memory, dtype=self.dtype, count=size * dim).reshape(size, dim)
            if init is not None and size:
                init(shard, self.plan.runs(index))
            else:
                shard.fill(0)
            if versions:
                vmemory = self.version_win.tomemory() if size else bytearray(0)
                self.versions = np.frombuffer(vmemory, dtype=np.int64, count=size)
                self.versions.fill(0)
            if self.channel is not None:
                self.service = packed_transport.PsService(self.channel, shard, spin_seconds, self.versions)
        idle_barrier(comm)  # shards initialized before anyone reads
        self._locked = self.transport == "rma" and not self.is_ps
        if self._locked:
            self.win.Lock_all()
            if self.version_win is not None:
                self.version_win.Lock_all()
        # rows this rank moved, by operation; and HET's version reads and additions (8 bytes each)
        self.rows_moved = {"pull": 0, "put": 0, "accumulate": 0, "version_read": 0, "version_add": 0}

    # ------------------------------------------------------------ operations
    def _batches(self, rows: np.ndarray, only: Optional[int] = None) -> list:
        """(target rank, positions in ``rows``, local rows, columns) per PS rank and piece width, by rank.

        ``columns`` is None for whole rows; for column slices it is each
        piece's column indices ``[n, width]``, and the local rows count rows
        of that width. All pieces of one width on one rank come as one entry,
        whichever columns they hold (one packed message; with one-sided
        operations a rank's entries make one operation, see ``_target_type``).
        ``only``: the pieces on that PS shard. Routing is one kernel call
        (``ShardPlan.routes``), since every operation of every iteration starts here.
        """
        if len(rows) == 0:
            return []
        if self.channel is not None and len(rows) * (8 + self.row_bytes) > _MAX_MESSAGE_BYTES:
            raise ValueError(f"{len(rows)} rows of {self.row_bytes} bytes exceed one MPI message; split them")
        position, local, col_lo, bounds = self.plan.routes(rows, only)  # a ShardPlanError (ValueError) if outside
        batches = []
        for key in np.flatnonzero(bounds[1:] != bounds[:-1]).tolist():
            s, width = self.plan.route_key(key)
            mine = slice(int(bounds[key]), int(bounds[key + 1]))
            columns = None if width in (0, self.dim) else col_lo[mine, None] + np.arange(width)
            batches.append((self.ps_ranks[s], position[mine], local[mine], columns))
        return batches

    def _by_target(self, rows: np.ndarray, only: Optional[int]) -> list:
        """(target rank, [(positions, local rows, columns), ...]): a rank's pieces, one entry per width."""
        grouped: list = []
        for target, positions, local, columns in self._batches(rows, only):
            if grouped and grouped[-1][0] == target:
                grouped[-1][1].append((positions, local, columns))
            else:
                grouped.append((target, [(positions, local, columns)]))
        return grouped

    def _staging(self, parts) -> tuple[np.ndarray, list]:
        """One contiguous buffer for a rank's parts, and a ``[n, width]`` view of it per part, in order."""
        widths = [self.dim if columns is None else columns.shape[1] for _, _, columns in parts]
        if len(parts) == 1:
            flat = np.empty(len(parts[0][0]) * widths[0], dtype=self.dtype)
            return flat, [flat.reshape(-1, widths[0])]
        sizes = [len(positions) * w for (positions, _, _), w in zip(parts, widths)]
        flat = np.empty(sum(sizes), dtype=self.dtype)
        bounds = np.cumsum([0, *sizes])
        return flat, [flat[lo:hi].reshape(-1, w) for lo, hi, w in zip(bounds[:-1], bounds[1:], widths)]

    def _target_type(self, parts) -> MPI.Datatype:
        """A rank's target rows as one datatype, in the order of the parts' staging.

        One width: an indexed type of rows of that width (displacements count
        rows). Several widths (column slices): blocks of each piece's width at
        its byte offset, so a rank costs one operation however its pieces
        are cut.
        """
        if len(parts) > 1:
            lengths, offsets = [], []
            for _, local, columns in parts:
                width = self.dim if columns is None else columns.shape[1]
                lengths.append(np.full(len(local), width))
                offsets.append(local * (width * self.dtype.itemsize))
            return self.basic.Create_hindexed(np.concatenate(lengths).tolist(),
                                              np.concatenate(offsets).tolist()).Commit()
        _, local_rows, columns = parts[0]
        width = self.dim if columns is None else columns.shape[1]
        if width == self.dim:
            row = self.row_type
        else:
            row = self._slice_types.get(width)
            if row is None:
                row = self._slice_types[width] = self.basic.Create_contiguous(width).Commit()
        return row.Create_indexed_block(1, local_rows.astype(np.int32).tolist()).Commit()

    @property
    def wire_row_bytes(self) -> int:
        """Bytes of one row as training moves it: 16-bit values on the packed transport with a 16-bit wire,
        else the stored width (one-sided operations move the window's type)."""
        return self.dim * (2 if self._sixteen(False) and self.channel is not None else self.dtype.itemsize)

    def _sixteen(self, exact: bool) -> bool:
        """Whether an operation rounds to 16 bits: training's, with a 16-bit wire."""
        return self.wire.sixteen_bit and not exact

    def pull(self, rows: np.ndarray, out: np.ndarray, at: Optional[np.ndarray] = None, *,
             only: Optional[int] = None, exact: bool = False) -> Handle:
        """Start reading ``rows[i]`` into ``out[i]``, or into ``out[at[i]]`` (e.g. cache slots).

        ``only``: read just what PS shard ``only`` holds of the rows (timing one rank's share).
        ``exact``: full precision whatever the wire (reads that are not training's: module docstring).
        """
        if at is None:
            self._check_values(rows, out, "out")
        elif len(at) != len(rows) or out.ndim != 2 or out.shape[1] != self.dim or out.dtype != self.dtype:
            raise ValueError(f"out/at: expected [*, {self.dim}] {self.dtype} and {len(rows)} positions, "
                             f"got {out.shape} {out.dtype} and {len(at)} positions")
        self.rows_moved["pull"] += len(rows)
        handle = Handle(self)
        sixteen = self._sixteen(exact)
        if self._whole_rma:
            return self._get_whole(rows, out, at, only, handle, sixteen)
        for target, parts in self._by_target(rows, only):
            flat, staged = self._staging(parts)
            if self.channel is not None:  # one message per width
                for (_, local, columns), staging in zip(parts, staged):
                    reply = np.empty(staging.shape, dtype=np.uint16) if sixteen else staging
                    requests, ids = packed_transport.request_pull(self.channel, target, local, reply,
                                                                  width=self._slice_width(columns), sixteen=sixteen)
                    handle.requests += requests
                    handle.buffers.append(ids)
                    if sixteen:
                        handle.decoded.append((reply, staging))
            else:  # one Get per rank, whatever the widths
                ttype = self._target_type(parts)
                self.win.Get([flat, flat.size, self.basic], target, target=(0, 1, ttype))
                ttype.Free()
                handle.targets.append(target)
                if sixteen:
                    handle.rounded.append(flat)
            for (positions, _, columns), staging in zip(parts, staged):
                handle.scatter.append((out, positions if at is None else at[positions], staging, columns))
        return handle

    def _get_whole(self, rows, out, at, only, handle: Handle, sixteen: bool) -> Handle:
        """:meth:`pull` of whole rows with one-sided operations: one ``Get`` per PS rank.

        Rows all on one PS rank and no ``at`` land in ``out`` itself (the
        kernel keeps their order); otherwise in a staging buffer, scattered
        once flushed. Each call of an operation is a few Python steps: after
        every forward and backward they run about three times slower than
        in a loop of their own (docs/benchmarks.md, issue 54).
        """
        if not len(rows):
            handle.done = True
            return handle
        for shard, positions, local in self.plan.by_shard(rows, only):
            target = self.ps_ranks[shard]
            direct = at is None and len(local) == len(rows) and out.flags.c_contiguous
            staging = out if direct else np.empty((len(local), self.dim), dtype=self.dtype)
            ttype = self.row_type.Create_indexed_block(1, local).Commit()
            self.win.Get([staging, staging.size, self.basic], target, target=(0, 1, ttype))
            ttype.Free()
            handle.targets.append(target)
            if sixteen:
                handle.rounded.append(staging)
            if not direct:
                handle.scatter.append((out, positions if at is None else at[positions], staging, None))
        return handle

    def _write_whole(self, rows, values, accumulate: bool, only, op, handle: Handle) -> Handle:
        """:meth:`_write` of whole rows with one-sided operations: one ``Put`` or ``Accumulate`` per PS rank.

        Rows all on one PS rank are sent from ``values`` itself when it is
        contiguous (MPI reads it until the flush, so it must not change
        before the handle completes; every caller passes a fresh array).
        """
        if not len(rows):
            handle.done = True
            return handle
        for shard, positions, local in self.plan.by_shard(rows, only):
            target = self.ps_ranks[shard]
            if len(local) == len(rows) and values.flags.c_contiguous:
                staging = values
            else:
                staging = np.take(values, positions, axis=0)
            self._issue_write(handle, target, staging, self.row_type.Create_indexed_block(1, local).Commit(),
                              accumulate, op)
        return handle

    def _issue_write(self, handle: Handle, target: int, staging: np.ndarray, ttype: MPI.Datatype,
                     accumulate: bool, op) -> None:
        """One ``Put`` or ``Accumulate`` of ``staging`` to ``target``'s rows ``ttype`` (freed here), on ``handle``."""
        origin = [staging, staging.size, self.basic]
        if accumulate:
            self.win.Accumulate(origin, target, target=(0, 1, ttype), op=op)
        else:
            self.win.Put(origin, target, target=(0, 1, ttype))
        ttype.Free()
        handle.targets.append(target)
        handle.buffers.append(staging)

    def read_versions(self, rows: np.ndarray, out: np.ndarray) -> Handle:
        """Start reading the versions of ``rows`` into ``out`` (int64, one per row; HET)."""
        if self.version_win is None:
            raise ValueError("this store keeps no versions (EmbeddingStore(versions=True))")
        if out.shape != (len(rows),) or out.dtype != np.int64:
            raise ValueError(f"out: expected ({len(rows)},) int64, got {out.shape} {out.dtype}")
        self.rows_moved["version_read"] += len(rows)
        handle = Handle(self)
        for target, positions, local, _ in self._batches(rows):
            staging = np.empty((len(positions), 1), dtype=np.int64)
            if self.channel is not None:
                requests, ids = packed_transport.request_pull(self.channel, target, local, staging, versions=True)
                handle.requests += requests
                handle.buffers.append(ids)
            else:
                ttype = MPI.INT64_T.Create_indexed_block(1, local.astype(np.int32).tolist()).Commit()
                self.version_win.Get([staging, len(positions), MPI.INT64_T], target, target=(0, 1, ttype))
                ttype.Free()
                handle.version_targets.append(target)
            handle.scatter.append((out, positions, staging[:, 0], None))
        return handle

    def add_versions(self, rows: np.ndarray, counts: np.ndarray) -> Handle:
        """Start adding ``counts`` (int64) to the versions of ``rows`` (HET: the updates a push carries)."""
        if self.version_win is None:
            raise ValueError("this store keeps no versions (EmbeddingStore(versions=True))")
        counts = np.ascontiguousarray(counts, dtype=np.int64).reshape(-1, 1)
        if len(counts) != len(rows):
            raise ValueError(f"counts: expected {len(rows)}, got {len(counts)}")
        self.rows_moved["version_add"] += len(rows)
        handle = Handle(self)
        for target, positions, local, _ in self._batches(rows):
            if self.channel is not None:
                requests, packed = packed_transport.request_write(self.channel, target, local, counts, positions,
                                                                  packed_transport.VERSION_ADD)
                handle.requests += requests
                handle.buffers.append(packed)
                continue
            staging = np.ascontiguousarray(counts[positions, 0])
            ttype = MPI.INT64_T.Create_indexed_block(1, local.astype(np.int32).tolist()).Commit()
            self.version_win.Accumulate([staging, len(positions), MPI.INT64_T], target, target=(0, 1, ttype),
                                        op=MPI.SUM)
            ttype.Free()
            handle.version_targets.append(target)
            handle.buffers.append(staging)
        return handle

    def put(self, rows: np.ndarray, values: np.ndarray, *, only: Optional[int] = None,
            exact: bool = False) -> Handle:
        """Start overwriting ``rows`` with ``values`` (rows owned exclusively by the caller).

        ``values`` must not change until the handle completes: MPI may read it until then.
        ``exact``: full precision whatever the wire (writes that are not training's: module docstring)."""
        return self._write(rows, values, accumulate=False, only=only, exact=exact)

    def accumulate(self, rows: np.ndarray, values: np.ndarray, *, only: Optional[int] = None,
                   exact: bool = False) -> Handle:
        """Start adding ``values`` to ``rows`` (element-wise atomic sum at the PS, in its precision: a 16-bit
        wire rounds ``values``, not the sum); ``values`` unchanged until the handle completes."""
        return self._write(rows, values, accumulate=True, only=only, exact=exact)

    def replace(self, rows: np.ndarray, values: np.ndarray) -> Handle:
        """Start overwriting ``rows`` that several workers write at once, each with the same ``values``.

        Row-wise Adagrad's shared rows: every trainer computes the same new
        row from the summed gradient. Concurrent ``Put``s to one location are
        erroneous in MPI; ``Accumulate(op=REPLACE)`` is element-wise atomic.
        The packed transport's PS applies messages one at a time, so a plain
        write is the same there. Counted as the accumulation it replaces.
        """
        return self._write(rows, values, accumulate=True, only=None, op=MPI.REPLACE)

    def _write(self, rows, values, accumulate: bool, only: Optional[int], op=MPI.SUM, exact: bool = False) -> Handle:
        self._check_values(rows, values, "values")
        self.rows_moved["accumulate" if accumulate else "put"] += len(rows)
        handle = Handle(self)
        sixteen = self._sixteen(exact)
        if sixteen and self.channel is None:  # one-sided: the rounded values at the window's width
            values = self.wire.round(values)
        if self._whole_rma:
            return self._write_whole(rows, values, accumulate, only, op, handle)
        for target, parts in self._by_target(rows, only):
            if self.channel is not None:  # one message per width; the rows go straight into it, one copy
                kind = packed_transport.write_kind(accumulate and op == MPI.SUM, sixteen)
                for positions, local, columns in parts:
                    if columns is not None:  # the pieces' values, gathered once
                        values_of, positions = values[positions[:, None], columns], np.arange(len(positions))
                    else:
                        values_of = values
                    requests, packed = packed_transport.request_write(
                        self.channel, target, local, values_of, positions, kind, width=self._slice_width(columns),
                        sixteen=sixteen)
                    handle.requests += requests
                    handle.buffers.append(packed)
                continue
            staging, staged = self._staging(parts)  # one Put or Accumulate per rank, whatever the widths
            for (positions, _, columns), view in zip(parts, staged):
                if columns is None:
                    np.take(values, positions, axis=0, out=view)
                else:
                    view[:] = values[positions[:, None], columns]
            self._issue_write(handle, target, staging, self._target_type(parts), accumulate, op)
        return handle

    def complete(self, *handles: Handle) -> None:
        """Complete ``handles`` (one ``Flush`` per PS rank they reach, or their replies); then reads land in place."""
        pending = [h for h in handles if not h.done]
        for target in sorted({t for h in pending for t in h.targets}):
            self.win.Flush(target)
        for target in sorted({t for h in pending for t in h.version_targets}):
            self.version_win.Flush(target)
        requests = [r for h in pending for r in h.requests]
        if requests:
            MPI.Request.Waitall(requests)
        for handle in pending:
            handle._finish()

    def _slice_width(self, columns: Optional[np.ndarray]) -> int:
        """A packed message's column width: 0 for whole rows."""
        return 0 if columns is None else columns.shape[1]

    def _check_values(self, rows, array, name) -> None:
        expected = (len(rows), self.dim)
        if array.shape != expected or array.dtype != self.dtype:
            raise ValueError(f"{name}: expected {expected} {self.dtype}, got {array.shape} {array.dtype}")

    # --------------------------------------------------------------- whole
    def read_all(self) -> np.ndarray:
        """Every row, read by the calling worker (checkpoints, tests)."""
        out = np.empty((self.plan.n_rows, self.dim), dtype=self.dtype)
        chunk = max(1, (256 << 20) // self.row_bytes)
        for begin in range(0, self.plan.n_rows, chunk):
            rows = np.arange(begin, min(begin + chunk, self.plan.n_rows))
            self.pull(rows, out[begin:begin + chunk], exact=True).wait()
        return out

    def barrier(self) -> None:
        """A barrier over ``comm`` (collective) during which PS ranks serve packed messages.

        Workers enter it once their handles are complete, so when it returns
        no operation is in flight. PS ranks spend a training run in it.
        """
        if self.service is None:
            idle_barrier(self.comm, self.poll_seconds)  # PS ranks wait here without spinning while workers finish
        else:
            self.service.serve_until(self.comm.Ibarrier())

    def close(self) -> None:
        """End the epoch and free the window (collective)."""
        if self.win is None:
            return
        if self._locked:
            self.win.Unlock_all()
            if self.version_win is not None:
                self.version_win.Unlock_all()
        self.barrier()
        self.win.Free()
        if self.version_win is not None:
            self.version_win.Free()
            self.version_win = None
        self.row_type.Free()
        for row in self._slice_types.values():
            row.Free()
        if self.channel is not None:
            self.channel.Free()
        self.win = None
        self.shard = None

    def __enter__(self) -> "EmbeddingStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
