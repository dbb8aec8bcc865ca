# cython: language_level=3, boundscheck=False, wraparound=False
"""Row gather, overwrite and add on a PS shard, for the packed transport (docs/design.md section 12).

A PS rank applies a worker's packed message to its shard in one pass: rows
are checked against the shard first (a message from a buggy or mismatched
worker must not write outside the window), then copied without the GIL.
``add_rows`` adds duplicates twice, as ``MPI_Accumulate`` would, where
NumPy's ``shard[rows] += values`` would add them once.
"""
from cython cimport floating
from libc.stdint cimport int32_t, int64_t, uint16_t, uint32_t
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


def sgd_rows(floating[:, ::1] cache, const int32_t[::1] slots, const int32_t[::1] positions,
             const floating[:, ::1] gradients, double lr):
    """``cache[slots[p], :dim] -= lr * gradients[p]`` for each ``p`` in ``positions`` (a worker's local SGD).

    The arithmetic of NumPy's ``cache[slots[positions]] -= lr * gradients[positions]``
    in the cache's precision (``lr`` rounded to it first, a product, then a
    difference; setup.py turns off fused multiply-adds), so the result is
    the same bit for bit, in one pass instead of six. The positions' slots
    must differ (a worker's rows of one iteration do).
    """
    cdef Py_ssize_t i, j, dim = gradients.shape[1], n_slots = cache.shape[0]
    cdef int32_t p, bad = -1
    cdef floating rate = <floating>lr
    cdef floating* row
    if dim > cache.shape[1]:
        raise ValueError(f"gradients are {dim} wide, the cache's rows {cache.shape[1]}")
    with nogil:
        for i in range(positions.shape[0]):
            p = positions[i]
            if p < 0 or p >= gradients.shape[0] or p >= slots.shape[0] or slots[p] < 0 or slots[p] >= n_slots:
                bad = <int32_t>i
                break
    if bad >= 0:
        raise IndexError(f"position {positions[bad]}: outside the gradients ({gradients.shape[0]}) or its slot "
                         f"outside the cache ({n_slots})")
    with nogil:
        for i in range(positions.shape[0]):
            p = positions[i]
            row = &cache[slots[p], 0]
            for j in range(dim):
                row[j] = row[j] - rate * gradients[p, j]


# ------------------------------------------------------------------ bfloat16 on the wire (docs/design.md, section 14)
cdef inline uint16_t _bf16(float value) noexcept nogil:
    """The bfloat16 nearest ``value`` (ties to even) as its bits: fp32's sign, exponent and top 7 fraction bits.

    A NaN stays a NaN (its quiet bit set, so rounding cannot turn it into an infinity).
    """
    cdef uint32_t bits
    memcpy(&bits, &value, 4)
    if (bits & 0x7FFFFFFFu) > 0x7F800000u:
        return <uint16_t>((bits >> 16) | 0x40u)
    return <uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16)


cdef inline float _float(uint16_t half) noexcept nogil:
    """The value of bfloat16 bits (exact in fp32 and float64)."""
    cdef uint32_t bits = (<uint32_t>half) << 16
    cdef float value
    memcpy(&value, &bits, 4)
    return value


cdef int _holds(Py_ssize_t out, Py_ssize_t values) except -1:
    if out != values:
        raise ValueError(f"out must hold {values} values, got {out}")
    return 0


def encode_bf16(const floating[::1] values, uint16_t[::1] out):
    """``out[i]`` = the bfloat16 bits of ``values[i]`` (float64 is rounded to fp32 first, then to bfloat16)."""
    cdef Py_ssize_t i
    _holds(out.shape[0], values.shape[0])
    with nogil:
        for i in range(values.shape[0]):
            out[i] = _bf16(<float>values[i])


def decode_bf16(const uint16_t[::1] bits, floating[::1] out):
    """``out[i]`` = the value of bfloat16 ``bits[i]``."""
    cdef Py_ssize_t i
    _holds(out.shape[0], bits.shape[0])
    with nogil:
        for i in range(bits.shape[0]):
            out[i] = _float(bits[i])


def round_bf16(floating[::1] values):
    """``values[i]`` = its bfloat16 rounding, in place (what a round trip over the wire leaves)."""
    cdef Py_ssize_t i
    with nogil:
        for i in range(values.shape[0]):
            values[i] = _float(_bf16(<float>values[i]))


def gather_rows_bf16(const floating[:, ::1] shard, const int64_t[::1] rows, uint16_t[:, ::1] out):
    """``out[i]`` = the bfloat16 bits of ``shard[rows[i]]``: a PS rank's reply to a 16-bit pull."""
    cdef Py_ssize_t i, j, dim = shard.shape[1]
    _check(rows, shard.shape[0], dim, out.shape[0], out.shape[1], "out")
    with nogil:
        for i in range(rows.shape[0]):
            for j in range(dim):
                out[i, j] = _bf16(<float>shard[rows[i], j])


def put_rows_bf16(floating[:, ::1] shard, const int64_t[::1] rows, const uint16_t[:, ::1] values):
    """``shard[rows[i]]`` = the value of bfloat16 ``values[i]``."""
    cdef Py_ssize_t i, j, dim = shard.shape[1]
    _check(rows, shard.shape[0], dim, values.shape[0], values.shape[1], "values")
    with nogil:
        for i in range(rows.shape[0]):
            for j in range(dim):
                shard[rows[i], j] = _float(values[i, j])


def add_rows_bf16(floating[:, ::1] shard, const int64_t[::1] rows, const uint16_t[:, ::1] values):
    """``shard[rows[i]] +=`` the value of bfloat16 ``values[i]``, in order (duplicates add twice), in the
    shard's precision: the master rows keep their low bits."""
    cdef Py_ssize_t i, j, dim = shard.shape[1]
    cdef floating* target
    _check(rows, shard.shape[0], dim, values.shape[0], values.shape[1], "values")
    with nogil:
        for i in range(rows.shape[0]):
            target = &shard[rows[i], 0]
            for j in range(dim):
                target[j] += _float(values[i, j])
