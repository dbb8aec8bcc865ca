# cython: language_level=3, boundscheck=False, wraparound=False
"""Array form of the counter-based hash (``counter_hash.pxd``) for Python callers.

``hybrid.counter_hash`` computes the same values in NumPy; this module is the
reference that the C kernels use, so a test can check both agree bit for bit.
"""
import numpy as np
from cython cimport floating
from cython.parallel cimport prange
from libc.stdint cimport int64_t, uint64_t
from counter_hash cimport hash3, uniform3


def hash3_array(uint64_t seed, uint64_t stream, counters):
    """``hash3(seed, stream, c)`` for every ``c`` in ``counters`` (uint64 array)."""
    cdef const uint64_t[::1] c = np.ascontiguousarray(counters, dtype=np.uint64)
    out_array = np.empty(c.shape[0], dtype=np.uint64)
    cdef uint64_t[::1] out = out_array
    cdef Py_ssize_t i
    with nogil:
        for i in range(c.shape[0]):
            out[i] = hash3(seed, stream, c[i])
    return out_array


def uniform3_array(uint64_t seed, uint64_t stream, counters):
    """``uniform3(seed, stream, c)`` for every ``c`` in ``counters``."""
    cdef const uint64_t[::1] c = np.ascontiguousarray(counters, dtype=np.uint64)
    out_array = np.empty(c.shape[0], dtype=np.float64)
    cdef double[::1] out = out_array
    cdef Py_ssize_t i
    with nogil:
        for i in range(c.shape[0]):
            out[i] = uniform3(seed, stream, c[i])
    return out_array


def fill_uniform_rows(floating[:, ::1] out, uint64_t seed, uint64_t stream, int64_t first_row, double scale,
                      int threads=1):
    """``out[i, j] = (2 u - 1) * scale``, ``u = uniform3(seed, stream, (first_row + i) * dim + j)``, in place.

    The same values as ``hybrid.runtime.embedding_init.initial_rows`` (a test checks
    bit equality), written straight into ``out`` without temporaries, so a PS
    rank initializes its shard at memory speed with no extra memory.
    """
    cdef Py_ssize_t i, j, dim = out.shape[1]
    cdef uint64_t cell
    if first_row < 0:
        raise ValueError(f"first_row must be >= 0, got {first_row}")
    with nogil:
        for i in prange(out.shape[0], num_threads=threads, schedule="static"):
            cell = <uint64_t>(first_row + i) * <uint64_t>dim
            for j in range(dim):
                out[i, j] = <floating>((2.0 * uniform3(seed, stream, cell + j) - 1.0) * scale)
