# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Kernels of ``hybrid preprocess`` over Arrow string columns (docs/data.md, "Preprocessing").

A column arrives as Arrow lays it out: int32 offsets and one byte buffer.
Three passes read it without building a Python object per value:

- :func:`check_column`: which values match a format's pattern (hex, digits,
  signed digits, a 0/1 label), the exact languages of the regular
  expressions in ``hybrid/data/formats.py``;
- :func:`log1p_ints`: signed integers to ``log(1 + max(x, 0))``, empty = 0;
- :class:`StringDictionary`: each distinct value's id in first-seen order
  and its count (an input part's dictionary), and the merge of the parts'
  dictionaries into one (a column's vocabulary).

And one pass over a part's ids at the end, :func:`remap_ids`, to the store's.
"""
from libc.math cimport log1p
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy

import numpy as np

cdef extern from *:
    """
    static inline uint64_t tc_load64(const unsigned char* p) { uint64_t x; memcpy(&x, p, 8); return x; }
    """
    uint64_t tc_load64(const unsigned char* p) noexcept nogil

cdef enum:  # ^[01]$, ^[0-9]+$, ^-?[0-9]+$, ^[0-9a-fA-F]+$
    KIND_BIT = 0
    KIND_UINT = 1
    KIND_INT = 2
    KIND_HEX = 3

KINDS = {"bit": KIND_BIT, "uint": KIND_UINT, "int": KIND_INT, "hex": KIND_HEX}

cdef uint64_t K1 = 0x9E3779B97F4A7C15ULL
cdef uint64_t K2 = 0xBF58476D1CE4E5B9ULL


cdef inline uint64_t mix(uint64_t x) noexcept nogil:
    x ^= x >> 31
    x *= K2
    x ^= x >> 29
    return x


cdef inline uint64_t hash_bytes(const unsigned char* p, int64_t n) noexcept nogil:
    """Eight bytes per multiply: a Criteo value (8 hex digits) costs one."""
    cdef uint64_t h = <uint64_t>n * K1, tail = 0
    cdef int64_t i = 0, k
    while i + 8 <= n:
        h = (h ^ tc_load64(p + i)) * K1
        h ^= h >> 32
        i += 8
    for k in range(n - i):
        tail |= (<uint64_t>p[i + k]) << (8 * k)
    return mix((h ^ tail) * K1)


cdef uint8_t[4][256] ALLOWED  # ALLOWED[kind][c]: byte c may appear in a value of kind (a '-' only first)


cdef void fill_allowed() noexcept nogil:
    cdef int c
    for c in range(256):
        ALLOWED[KIND_BIT][c] = c == b'0' or c == b'1'
        ALLOWED[KIND_UINT][c] = b'0' <= c <= b'9'
        ALLOWED[KIND_INT][c] = b'0' <= c <= b'9' or c == b'-'
        ALLOWED[KIND_HEX][c] = b'0' <= c <= b'9' or b'a' <= c <= b'f' or b'A' <= c <= b'F'


fill_allowed()


cdef inline bint valid(const unsigned char* p, int64_t n, int kind, bint allow_empty) noexcept nogil:
    cdef int64_t i
    if n == 0:
        return allow_empty
    if kind == KIND_BIT:
        return n == 1 and ALLOWED[KIND_BIT][p[0]]
    if kind == KIND_INT and p[0] == b'-':
        if n == 1:
            return False
        p += 1
        n -= 1
    for i in range(n):
        if not ALLOWED[kind][p[i]] or p[i] == b'-':
            return False
    return True


cdef bint plainly_valid(const int32_t[::1] offsets, const unsigned char* base, int kind,
                        bint allow_empty) noexcept nogil:
    """Whether every value is valid, told from the bytes alone where it can be: all bytes allowed, no '-',
    no empty value unless allowed, one byte per 0/1 value. False means "look value by value"."""
    cdef int64_t n = offsets.shape[0] - 1, i
    cdef unsigned char ok = 1
    cdef const uint8_t* allowed = ALLOWED[KIND_UINT if kind == KIND_INT else kind]
    for i in range(offsets[0], offsets[n]):
        ok &= allowed[base[i]]
    if not ok:
        return False
    if kind == KIND_BIT:  # each value one byte: a total of n bytes is not enough ("" and "00" make 2)
        for i in range(n):
            ok &= offsets[i + 1] - offsets[i] == 1
        return ok
    if not allow_empty:
        for i in range(n):
            ok &= offsets[i + 1] > offsets[i]
    return ok


def check_column(const int32_t[::1] offsets, const uint8_t[::1] data, int kind, bint allow_empty,
                 uint8_t[::1] ok=None):
    """Index of the first value not of ``kind`` (empty allowed if ``allow_empty``), or -1.

    With ``ok`` (one byte per value), every value is checked and ``ok[i]``
    says whether value ``i`` is valid. A column whose bytes all pass is done
    in one branch-free pass over its bytes; only others are read value by value.
    """
    cdef int64_t n = offsets.shape[0] - 1, i, first = -1
    cdef const unsigned char* base = &data[0] if data.shape[0] else NULL
    cdef bint good
    if kind < KIND_BIT or kind > KIND_HEX:
        raise ValueError(f"unknown kind {kind}")
    if ok is not None and ok.shape[0] != n:
        raise ValueError(f"ok holds {ok.shape[0]} values, the column {n}")
    with nogil:
        if plainly_valid(offsets, base, kind, allow_empty):
            if ok is not None:
                for i in range(n):
                    ok[i] = 1
            n = 0  # nothing to read value by value
        for i in range(n):
            good = valid(base + offsets[i], offsets[i + 1] - offsets[i], kind, allow_empty)
            if ok is not None:
                ok[i] = good
            elif not good:
                first = i
                break
            if not good and first < 0:
                first = i
    return first


cdef enum:
    SMALL = 4096
cdef float[SMALL] LOG1P_SMALL  # float(log1p(x)) for x < SMALL: the most frequent counts, looked up


cdef void fill_log1p() noexcept nogil:
    cdef int x
    for x in range(SMALL):
        LOG1P_SMALL[x] = <float>log1p(<double>x)


fill_log1p()


def log1p_ints(const int32_t[::1] offsets, const uint8_t[::1] data, float[:] out):
    """``out[i] = log1p(max(x_i, 0))`` of each value (checked by ``check_column`` as KIND_INT); empty = 0.

    Digits are summed in double precision, as a float parse of the same text
    would, for values below 2**53; small values are looked up, computed alike.
    """
    cdef int64_t n = offsets.shape[0] - 1, i, j
    cdef const unsigned char* base = &data[0] if data.shape[0] else NULL
    cdef const unsigned char* p
    cdef double value
    cdef bint negative
    if out.shape[0] != n:
        raise ValueError(f"out holds {out.shape[0]} values, the column {n}")
    with nogil:
        for i in range(n):
            p = base + offsets[i]
            negative = offsets[i + 1] > offsets[i] and p[0] == b'-'
            value = 0.0
            for j in range(1 if negative else 0, offsets[i + 1] - offsets[i]):
                value = value * 10.0 + (p[j] - 48)
            if negative:
                out[i] = 0.0
            elif value < SMALL:
                out[i] = LOG1P_SMALL[<int>value]
            else:
                out[i] = <float>log1p(value)


def bits(const int32_t[::1] offsets, const uint8_t[::1] data, float[:] out):
    """A 0/1 column (checked as KIND_BIT) as floats."""
    cdef int64_t n = offsets.shape[0] - 1, i
    if out.shape[0] != n:
        raise ValueError(f"out holds {out.shape[0]} values, the column {n}")
    with nogil:
        for i in range(n):
            out[i] = <float>(data[offsets[i]] - 48)


cdef class StringDictionary:
    """Distinct byte strings, numbered in first-seen order, with their counts.

    Open addressing over slots that hold ids; every value's bytes live in one
    arena. Memory: the values' bytes plus about 36 bytes per distinct value.
    """
    cdef unsigned char* arena
    cdef int64_t arena_used, arena_size
    cdef int64_t* starts          # value k: arena[starts[k]:starts[k + 1]] (starts has size + 1 entries)
    cdef uint64_t* hashes
    cdef int64_t* counts_
    cdef int64_t capacity         # values the arrays above can hold
    cdef int32_t* slots           # id + 1, 0 = free
    cdef int64_t mask
    cdef readonly int64_t size

    def __cinit__(self):
        cdef int64_t i
        self.arena_size = 1 << 16
        self.capacity = 1 << 10
        self.arena = <unsigned char*>malloc(self.arena_size)
        self.starts = <int64_t*>malloc((self.capacity + 1) * sizeof(int64_t))
        self.hashes = <uint64_t*>malloc(self.capacity * sizeof(uint64_t))
        self.counts_ = <int64_t*>malloc(self.capacity * sizeof(int64_t))
        self.mask = 2 * self.capacity - 1
        self.slots = <int32_t*>malloc((self.mask + 1) * sizeof(int32_t))
        if not (self.arena and self.starts and self.hashes and self.counts_ and self.slots):
            raise MemoryError()
        for i in range(self.mask + 1):
            self.slots[i] = 0
        self.starts[0] = 0
        self.size = 0
        self.arena_used = 0

    def __dealloc__(self):
        free(self.arena)
        free(self.starts)
        free(self.hashes)
        free(self.counts_)
        free(self.slots)

    cdef int grow_values(self) except -1 nogil:
        """Double the per-value arrays and the slots (load stays <= 1/2)."""
        cdef int64_t capacity = 2 * self.capacity, k, i
        cdef int64_t* starts = <int64_t*>realloc(self.starts, (capacity + 1) * sizeof(int64_t))
        if starts == NULL:
            with gil:
                raise MemoryError()
        self.starts = starts
        cdef uint64_t* hashes = <uint64_t*>realloc(self.hashes, capacity * sizeof(uint64_t))
        if hashes == NULL:
            with gil:
                raise MemoryError()
        self.hashes = hashes
        cdef int64_t* counts = <int64_t*>realloc(self.counts_, capacity * sizeof(int64_t))
        if counts == NULL:
            with gil:
                raise MemoryError()
        self.counts_ = counts
        free(self.slots)
        self.mask = 2 * capacity - 1
        self.slots = <int32_t*>malloc((self.mask + 1) * sizeof(int32_t))
        if self.slots == NULL:
            with gil:
                raise MemoryError()
        for i in range(self.mask + 1):
            self.slots[i] = 0
        for k in range(self.size):
            i = <int64_t>(self.hashes[k] & <uint64_t>self.mask)
            while self.slots[i] != 0:
                i = (i + 1) & self.mask
            self.slots[i] = <int32_t>(k + 1)
        self.capacity = capacity
        return 0

    cdef int64_t find(self, const unsigned char* p, int64_t n, uint64_t h, bint insert) except -2 nogil:
        """Id of the value ``p[:n]``; absent: a new id if ``insert``, else -1."""
        cdef int64_t i = <int64_t>(h & <uint64_t>self.mask), k, need
        cdef unsigned char* arena
        while True:
            k = self.slots[i] - 1
            if k < 0:
                break
            if self.hashes[k] == h and self.starts[k + 1] - self.starts[k] == n \
                    and memcmp(self.arena + self.starts[k], p, n) == 0:
                return k
            i = (i + 1) & self.mask
        if not insert:
            return -1
        if self.size >= 2147483646:
            with gil:
                raise OverflowError("more than 2**31 - 2 distinct values in one column")
        if self.size == self.capacity:
            self.grow_values()
            return self.find(p, n, h, True)
        need = self.arena_used + n
        if need > self.arena_size:
            while need > self.arena_size:
                self.arena_size *= 2
            arena = <unsigned char*>realloc(self.arena, self.arena_size)
            if arena == NULL:
                with gil:
                    raise MemoryError()
            self.arena = arena
        k = self.size
        memcpy(self.arena + self.arena_used, p, n)
        self.arena_used = need
        self.starts[k + 1] = need
        self.hashes[k] = h
        self.counts_[k] = 0
        self.slots[i] = <int32_t>(k + 1)
        self.size += 1
        return k

    def encode(self, const int32_t[::1] offsets, const uint8_t[::1] data, int32_t[:] out):
        """``out[i]``: the id of value ``i``, new values numbered as they come; counts each value."""
        cdef int64_t n = offsets.shape[0] - 1, i, k
        cdef const unsigned char* base = &data[0] if data.shape[0] else NULL
        cdef const unsigned char* p
        cdef int64_t length
        if out.shape[0] != n:
            raise ValueError(f"out holds {out.shape[0]} values, the column {n}")
        with nogil:
            for i in range(n):
                p = base + offsets[i]
                length = offsets[i + 1] - offsets[i]
                k = self.find(p, length, hash_bytes(p, length), True)
                self.counts_[k] += 1
                out[i] = <int32_t>k

    def add(self, const int64_t[::1] offsets, const uint8_t[::1] data, const int64_t[::1] counts,
            int32_t[::1] out):
        """Merge another dictionary's values and counts (from :meth:`arrays`); ``out[i]``: value ``i``'s id here."""
        cdef int64_t n = offsets.shape[0] - 1, i, k
        cdef const unsigned char* base = &data[0] if data.shape[0] else NULL
        cdef const unsigned char* p
        cdef int64_t length
        if counts.shape[0] != n or out.shape[0] != n:
            raise ValueError(f"{n} values need as many counts and ids, got {counts.shape[0]} and {out.shape[0]}")
        with nogil:
            for i in range(n):
                p = base + offsets[i]
                length = offsets[i + 1] - offsets[i]
                k = self.find(p, length, hash_bytes(p, length), True)
                self.counts_[k] += counts[i]
                out[i] = <int32_t>k

    def arrays(self):
        """(int64 offsets [size + 1], uint8 bytes, int64 counts [size]): the values in id order, copied."""
        offsets = np.empty(self.size + 1, dtype=np.int64)
        data = np.empty(self.arena_used, dtype=np.uint8)
        counts = np.empty(self.size, dtype=np.int64)
        cdef int64_t[::1] o = offsets
        cdef uint8_t[::1] d = data
        cdef int64_t[::1] c = counts
        if self.size:
            memcpy(&o[0], self.starts, (self.size + 1) * sizeof(int64_t))
            memcpy(&c[0], self.counts_, self.size * sizeof(int64_t))
        else:
            o[0] = 0
        if self.arena_used:
            memcpy(&d[0], self.arena, self.arena_used)
        return offsets, data, counts


def remap_ids(const int32_t[:, :] ids, const int32_t[::1] table, const int64_t[::1] firsts, int32_t[:, ::1] out,
              int64_t[::1] lowest, int64_t[::1] highest):
    """Phase 3 of preprocessing: ``out[i, j] = table[firsts[j] + ids[i, j]]`` (a part's own ids to the store's,
    every column's table back to back in ``table``), and each column's lowest and highest id so far."""
    cdef Py_ssize_t n = ids.shape[0], columns = ids.shape[1], i, j
    cdef int64_t at
    cdef int32_t value
    if out.shape[0] != n or out.shape[1] != columns or firsts.shape[0] != columns \
            or lowest.shape[0] != columns or highest.shape[0] != columns:
        raise ValueError(f"ids are [{n}, {columns}]: out, firsts, lowest and highest must match")
    for j in range(columns):
        if firsts[j] < 0:
            raise ValueError(f"firsts[{j}] = {firsts[j]} is negative")
    with nogil:
        for i in range(n):
            for j in range(columns):
                at = firsts[j] + ids[i, j]
                if ids[i, j] < 0 or at >= table.shape[0]:
                    with gil:
                        raise IndexError(f"id {ids[i, j]} of column {j} is outside its table")
                value = table[at]
                out[i, j] = value
                if value < lowest[j]:
                    lowest[j] = value
                if value > highest[j]:
                    highest[j] = value
