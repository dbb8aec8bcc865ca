# cython: language_level=3, boundscheck=False, wraparound=False
"""Array form of the counter-based hash (``counter_hash.pxd``) for Python callers.

``hybrid.counter_hash`` computes the same values in NumPy; this module is the
reference that the C kernels use, so a test can check both agree bit for bit.
"""
import numpy as np
from cython cimport floating
from cython.parallel cimport prange
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy
from counter_hash cimport chain64, fold4, hash3, mix64, uniform3


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


def array_digest(data, *words):
    """A 64-bit hash of an array's bytes (C order), then of ``words`` (64-bit), for digests that ranks
    compare every iteration.

    Not cryptographic: it tells ranks whose schedules diverged apart, with
    the chains of the cluster state's event digest (``counter_hash.chain64``).
    A global batch's allocation (16,384 int32) took 33 us with SHA-256,
    serial on every rank; this takes 4.
    """
    cdef const unsigned char[::1] b = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    cdef Py_ssize_t n = b.shape[0], i = 0
    cdef uint64_t x0 = <uint64_t>n, x1 = x0 + 1, x2 = x0 + 2, x3 = x0 + 3, w0, w1, w2, w3
    with nogil:
        while i + 32 <= n:
            memcpy(&w0, &b[i], 8)
            memcpy(&w1, &b[i + 8], 8)
            memcpy(&w2, &b[i + 16], 8)
            memcpy(&w3, &b[i + 24], 8)
            x0, x1, x2, x3 = chain64(x0, w0), chain64(x1, w1), chain64(x2, w2), chain64(x3, w3)
            i += 32
        while i < n:  # the last words, the very last zero-padded
            w0 = 0
            memcpy(&w0, &b[i], min(8, n - i))
            x0 = chain64(x0, w0)
            i += 8
    x0 = fold4(x0, x1, x2, x3)
    for word in words:
        x0 = mix64(x0 ^ <uint64_t>word)
    return x0
