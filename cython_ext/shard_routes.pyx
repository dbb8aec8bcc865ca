# cython: language_level=3, boundscheck=False, wraparound=False
"""Where the pieces of a batch's rows live under a shard plan (docs/design.md section 8).

A worker routes every read and write: each row's pieces (one per column
slice of its table, one for a whole row) go to their PS shard, grouped by
shard and piece width so each group is one operation. Done in NumPy that
is a dozen passes over the rows (searches, repeats, a sort); here it is two
passes without the GIL and a counting sort. Every store operation of every
iteration starts here, so the rows' bounds are checked here too (two NumPy
reductions cost more than the routing of a batch's rows).
"""
import numpy as np

from libc.stdint cimport int64_t


cdef inline Py_ssize_t _group(const int64_t[::1] group_lo, int64_t row) noexcept nogil:
    """The last group whose first row is at most ``row`` (groups tile the rows in order)."""
    cdef Py_ssize_t lo = 0, hi = group_lo.shape[0] - 1, mid
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if group_lo[mid] <= row:
            lo = mid
        else:
            hi = mid - 1
    return lo


cdef class Router:
    """A shard plan's tables, held for routing (:class:`hybrid.runtime.shard_plan.ShardPlan` builds one).

    Per group: its first row, stride, first segment and pieces per row; per
    segment: its shard, base, first column and width (plans of whole rows:
    ``dim`` 0 and widths 0, so the keys are the shards). Held here, not
    passed per call: taking nine typed views costs more than routing a
    batch's rows.
    """

    cdef const int64_t[::1] group_lo, group_stride, group_first, group_pieces, shard, base, col_lo, width
    cdef readonly int64_t n_shards, dim, n_rows
    cdef object arrays  # the arrays the views are of, for pickling

    def __init__(self, group_lo, group_stride, group_first, group_pieces, shard, base, col_lo, width,
                 int64_t n_shards, int64_t dim, int64_t n_rows):
        self.arrays = tuple(np.ascontiguousarray(a, dtype=np.int64) for a in
                            (group_lo, group_stride, group_first, group_pieces, shard, base, col_lo, width))
        self.group_lo, self.group_stride, self.group_first, self.group_pieces = self.arrays[:4]
        self.shard, self.base, self.col_lo, self.width = self.arrays[4:]
        self.n_shards, self.dim, self.n_rows = n_shards, dim, n_rows

    def __reduce__(self):
        """Plans travel between ranks pickled; so does their router."""
        return Router, (*self.arrays, self.n_shards, self.dim, self.n_rows)

    def route(self, const int64_t[::1] rows, int64_t only):
        """Every piece of ``rows`` (on shard ``only``, or on all when ``only < 0``), grouped by (shard, width).

        Returns ``(position, local, col_lo, bounds)``: pieces in (shard,
        width, row) order and ``bounds`` ``[n_shards * (dim + 1) + 1]``, the
        pieces of key ``shard * (dim + 1) + width`` being
        ``bounds[key]:bounds[key + 1]``. Raises ``ValueError`` for a row
        outside ``[0, n_rows)``.
        """
        cdef Py_ssize_t n = rows.shape[0], n_keys = self.n_shards * (self.dim + 1), i, j, g, total = 0
        cdef int64_t offset, seg, step, key, lowest = 0, highest = 0, dim = self.dim
        counts = np.zeros(n_keys + 1, dtype=np.int64)
        cdef int64_t[::1] c = counts
        with nogil:
            for i in range(n):
                if rows[i] < lowest:
                    lowest = rows[i]
                if rows[i] > highest:
                    highest = rows[i]
        if n and (lowest < 0 or highest >= self.n_rows):
            raise ValueError(f"rows must be in [0, {self.n_rows}), got [{np.min(rows)}, {np.max(rows)}]")
        with nogil:
            for i in range(n):
                g = _group(self.group_lo, rows[i])
                offset = rows[i] - self.group_lo[g]
                seg = self.group_first[g] + (offset % self.group_stride[g]) * self.group_pieces[g]
                for j in range(self.group_pieces[g]):
                    if only < 0 or self.shard[seg + j] == only:
                        c[self.shard[seg + j] * (dim + 1) + self.width[seg + j] + 1] += 1
                        total += 1
            for i in range(n_keys):
                c[i + 1] += c[i]
        position = np.empty(total, dtype=np.int64)
        local = np.empty(total, dtype=np.int64)
        first_col = np.empty(total, dtype=np.int64)
        fill = counts[:-1].copy()
        cdef int64_t[::1] p = position, at = local, cl = first_col, f = fill
        with nogil:
            for i in range(n):
                g = _group(self.group_lo, rows[i])
                offset = rows[i] - self.group_lo[g]
                seg = self.group_first[g] + (offset % self.group_stride[g]) * self.group_pieces[g]
                step = offset // self.group_stride[g]
                for j in range(self.group_pieces[g]):
                    if only < 0 or self.shard[seg + j] == only:
                        key = self.shard[seg + j] * (dim + 1) + self.width[seg + j]
                        p[f[key]] = i
                        at[f[key]] = self.base[seg + j] + step
                        cl[f[key]] = self.col_lo[seg + j]
                        f[key] += 1
        return position, local, first_col, counts

    def by_shard(self, const int64_t[::1] rows, int64_t only):
        """A plan of whole rows: ``[(shard, positions, local rows)]`` for each shard holding some of ``rows``.

        The one-sided store's fast path (``EmbeddingStore``): ``positions``
        index ``rows`` (in row order within a shard, so ``arange(n)`` when one
        shard holds them all) and the local rows come as a list of ints, the
        form MPI's indexed datatypes are built from. One call instead of a
        dozen Python steps per operation: an operation's Python runs cold
        after each forward and backward (docs/benchmarks.md, issue 54).
        """
        if self.dim != 0:
            raise ValueError("by_shard routes plans of whole rows; this plan has column slices")
        position, local, _, counts = self.route(rows, only)
        cdef const int64_t[::1] c = counts
        cdef Py_ssize_t s
        found = []
        for s in range(self.n_shards):
            if c[s + 1] > c[s]:
                found.append((s, position[c[s]:c[s + 1]], local[c[s]:c[s + 1]].tolist()))
        return found
