# cython: language_level=3, boundscheck=False, wraparound=False
"""Where the pieces of a batch's rows live under a shard plan with column slices (docs/design.md section 8).

A worker routes every read and write: each row's pieces (one per column
slice of its table, one for a whole row) go to their PS shard, grouped by
shard and piece width so each group is one operation. Done in NumPy that
is a dozen passes over the rows (searches, repeats, a sort); here it is two
passes without the GIL and a counting sort, so routing a plan with column
slices costs what routing whole rows costs.
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


def route(const int64_t[::1] rows, const int64_t[::1] group_lo, const int64_t[::1] group_stride,
          const int64_t[::1] group_first, const int64_t[::1] group_pieces, const int64_t[::1] shard,
          const int64_t[::1] base, const int64_t[::1] col_lo, const int64_t[::1] width, int64_t n_shards,
          int64_t dim, int64_t only):
    """Every piece of ``rows`` (on shard ``only``, or on all when ``only < 0``), grouped by (shard, width).

    The plan's arrays are :class:`hybrid.runtime.shard_plan.ShardPlan`'s: per group
    its first row, stride, first segment and pieces per row; per segment its
    shard, base, first column and width (whole rows: ``dim``). Returns
    ``(position, local, col_lo, bounds)``: pieces in (shard, width, row)
    order and ``bounds`` ``[n_shards * (dim + 1) + 1]``, the pieces of key
    ``shard * (dim + 1) + width`` being ``bounds[key]:bounds[key + 1]``.
    """
    cdef Py_ssize_t n = rows.shape[0], n_keys = n_shards * (dim + 1), i, j, g, total = 0
    cdef int64_t offset, seg, step, key
    counts = np.zeros(n_keys + 1, dtype=np.int64)
    cdef int64_t[::1] c = counts
    with nogil:
        for i in range(n):
            g = _group(group_lo, rows[i])
            offset = rows[i] - group_lo[g]
            seg = group_first[g] + (offset % group_stride[g]) * group_pieces[g]
            for j in range(group_pieces[g]):
                if only < 0 or shard[seg + j] == only:
                    c[shard[seg + j] * (dim + 1) + width[seg + j] + 1] += 1
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
            g = _group(group_lo, rows[i])
            offset = rows[i] - group_lo[g]
            seg = group_first[g] + (offset % group_stride[g]) * group_pieces[g]
            step = offset // group_stride[g]
            for j in range(group_pieces[g]):
                if only < 0 or shard[seg + j] == only:
                    key = shard[seg + j] * (dim + 1) + width[seg + j]
                    p[f[key]] = i
                    at[f[key]] = base[seg + j] + step
                    cl[f[key]] = col_lo[seg + j]
                    f[key] += 1
    return position, local, first_col, counts
