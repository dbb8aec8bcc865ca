# cython: language_level=3, boundscheck=False, wraparound=False
"""Row gather, overwrite and add on a PS shard, for the packed transport (docs/design.md section 12).

A PS rank applies a worker's packed message to its shard in one pass: rows
are checked against the shard first (a message from a buggy or mismatched
worker must not write outside the window), then copied without the GIL.
``add_rows`` adds duplicates twice, as ``MPI_Accumulate`` would, where
NumPy's ``shard[rows] += values`` would add them once.
"""
from cython cimport floating
from libc.stdint cimport int64_t
from libc.string cimport memcpy


cdef int _check(const int64_t[::1] rows, Py_ssize_t n_rows, Py_ssize_t dim, Py_ssize_t block_rows,
                Py_ssize_t block_dim, str block) except -1:
    """The block (values or out) is ``[len(rows), dim]`` and every row is inside the shard of ``n_rows``."""
    cdef Py_ssize_t i
    cdef int64_t bad = -1
    if block_rows != rows.shape[0] or block_dim != dim:
        raise ValueError(f"{block} must be [{rows.shape[0]}, {dim}], got [{block_rows}, {block_dim}]")
    with nogil:
        for i in range(rows.shape[0]):
            if rows[i] < 0 or rows[i] >= n_rows:
                bad = i
                break
    if bad >= 0:
        raise IndexError(f"row {rows[bad]} is outside this shard of {n_rows} rows")
    return 0


def gather_rows(const floating[:, ::1] shard, const int64_t[::1] rows, floating[:, ::1] out):
    """``out[i] = shard[rows[i]]``."""
    cdef Py_ssize_t i, dim = shard.shape[1]
    _check(rows, shard.shape[0], dim, out.shape[0], out.shape[1], "out")
    with nogil:
        for i in range(rows.shape[0]):
            memcpy(&out[i, 0], &shard[rows[i], 0], dim * sizeof(floating))


def put_rows(floating[:, ::1] shard, const int64_t[::1] rows, const floating[:, ::1] values):
    """``shard[rows[i]] = values[i]``."""
    cdef Py_ssize_t i, dim = shard.shape[1]
    _check(rows, shard.shape[0], dim, values.shape[0], values.shape[1], "values")
    with nogil:
        for i in range(rows.shape[0]):
            memcpy(&shard[rows[i], 0], &values[i, 0], dim * sizeof(floating))


def add_rows(floating[:, ::1] shard, const int64_t[::1] rows, const floating[:, ::1] values):
    """``shard[rows[i]] += values[i]`` for every ``i`` in order (duplicates add twice)."""
    cdef Py_ssize_t i, j, dim = shard.shape[1]
    cdef floating* target
    _check(rows, shard.shape[0], dim, values.shape[0], values.shape[1], "values")
    with nogil:
        for i in range(rows.shape[0]):
            target = &shard[rows[i], 0]
            for j in range(dim):
                target[j] += values[i, j]
