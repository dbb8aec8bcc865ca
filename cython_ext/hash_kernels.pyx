# cython: language_level=3, boundscheck=False, wraparound=False
"""Array form of the counter-based hash (``counter_hash.pxd``) for Python callers.

``hybrid.counter_hash`` computes the same values in NumPy; this module is the
reference that the C kernels use, so a test can check both agree bit for bit.
"""
import numpy as np
from libc.stdint cimport uint64_t
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
