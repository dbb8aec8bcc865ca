# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Location-aware input allocation (Herald's Algorithm 1), exact and chunked.

Scoring reads the cluster state's per-row holder bitsets: the score of
sample ``i`` on worker ``w`` is the number of its rows whose latest value
``w`` holds (docs/design.md section 4). That costs samples x tables array reads
plus one step per holder bit, not samples x workers x tables set lookups.

Allocation gives each sample, in order, to the highest-scoring worker that
still has capacity; ties go to a uniformly chosen tied worker, chosen by a
counter-based hash of (seed, iteration, sample), never by a stateful RNG.
The chunked form splits samples and capacities into a fixed number of chunks
that are allocated independently (in parallel, without locks), so its result
depends on the chunk count but never on the thread count.
"""
import numpy as np
from cython.parallel cimport prange
from libc.stdint cimport int32_t, int64_t, uint64_t
from counter_hash cimport hash3

cdef extern from *:
    int ctz64 "__builtin_ctzll"(unsigned long long) nogil
    void prefetch "__builtin_prefetch"(const void*) nogil

cdef enum:
    TIE_STREAM = 0x7A1E


def score(*, const uint64_t[::1] holders, int words, int n_workers, const int64_t[:, ::1] rows,
          const int32_t[::1] tables, int32_t[:, ::1] out, int threads=1):
    """``out[i, w]`` = rows of sample ``i`` (in the given ``tables``) fresh on worker ``w``."""
    cdef Py_ssize_t n_samples = rows.shape[0], n_tables = rows.shape[1]
    if out.shape[0] != n_samples or out.shape[1] != n_workers:
        raise ValueError(f"out: expected shape ({n_samples}, {n_workers}), got ({out.shape[0]}, {out.shape[1]})")
    if words * 64 < n_workers + 1:
        raise ValueError(f"{words} holder words cannot hold PS + {n_workers} workers")
    cdef Py_ssize_t k
    for k in range(tables.shape[0]):
        if tables[k] < 0 or tables[k] >= n_tables:
            raise ValueError(f"tables[{k}] = {tables[k]} is not a table in [0, {n_tables})")
    cdef Py_ssize_t i, w, word
    cdef int64_t e
    cdef uint64_t x
    with nogil:
        for i in prange(n_samples, num_threads=threads, schedule="static"):
            for w in range(n_workers):
                out[i, w] = 0
            if i + 1 < n_samples:  # overlap the next sample's (random) holder reads
                for k in range(tables.shape[0]):
                    prefetch(&holders[rows[i + 1, tables[k]] * words])
            for k in range(tables.shape[0]):
                e = rows[i, tables[k]]
                for word in range(words):
                    x = holders[e * words + word]
                    if word == 0:
                        x = x & ~(<uint64_t>1)  # bit 0 is the PS
                    while x:
                        out[i, 64 * word + ctz64(x) - 1] += 1
                        x = x & (x - 1)


cdef void allocate_range(const int32_t[:, ::1] scores, int64_t first, int64_t last,
                         int64_t* remaining, uint64_t seed, uint64_t iteration,
                         int32_t[::1] alloc, const int64_t* order) noexcept nogil:
    """Algorithm 1 on samples [first, last) with per-worker ``remaining`` capacity.

    ``order`` (or NULL: as they come) gives the sample taken at each step; a
    tie is broken by a hash of the sample, not of the step, so the choice
    for a sample does not depend on where the order puts it.
    """
    cdef Py_ssize_t n_workers = scores.shape[1]
    cdef int64_t i, j, w, best, ties, pick
    cdef uint64_t stream = iteration * <uint64_t>0x100000001B3ULL + TIE_STREAM
    for j in range(first, last):
        i = order[j] if order != NULL else j
        best = -1
        ties = 0
        for w in range(n_workers):
            if remaining[w] > 0:
                if scores[i, w] > best:
                    best = scores[i, w]
                    ties = 1
                elif scores[i, w] == best:
                    ties += 1
        pick = <int64_t>(hash3(seed, stream, <uint64_t>i) % <uint64_t>ties)
        for w in range(n_workers):
            if remaining[w] > 0 and scores[i, w] == best:
                if pick == 0:
                    alloc[i] = <int32_t>w
                    remaining[w] -= 1
                    break
                pick -= 1


def allocate_exact(*, const int32_t[:, ::1] scores, const int64_t[::1] capacity, uint64_t seed,
                   uint64_t iteration, order=None):
    """Herald's Algorithm 1, sequential over samples (in ``order``, a permutation, if given).

    Returns int32 worker per sample.
    """
    cdef Py_ssize_t n_samples = scores.shape[0], n_workers = scores.shape[1]
    if capacity.shape[0] != n_workers:
        raise ValueError(f"capacity: expected {n_workers} workers, got {capacity.shape[0]}")
    if np.asarray(capacity).sum() != n_samples:
        raise ValueError(f"capacities sum to {np.asarray(capacity).sum()}, expected {n_samples} samples")
    cdef int64_t[::1] steps
    cdef const int64_t* taken = NULL
    if order is not None:
        steps = np.ascontiguousarray(order, dtype=np.int64)
        if steps.shape[0] != n_samples or not np.array_equal(np.sort(np.asarray(steps)), np.arange(n_samples)):
            raise ValueError(f"order must be a permutation of the {n_samples} samples")
        taken = &steps[0] if n_samples else NULL
    cdef int64_t[::1] remaining = np.array(capacity, dtype=np.int64)
    alloc = np.empty(n_samples, dtype=np.int32)
    cdef int32_t[::1] out = alloc
    with nogil:
        allocate_range(scores, 0, n_samples, &remaining[0], seed, iteration, out, taken)
    return alloc


def allocate_chunked(*, const int32_t[:, ::1] scores, const int64_t[:, ::1] chunk_capacity,
                     const int64_t[::1] chunk_start, uint64_t seed, uint64_t iteration, int threads=1):
    """Algorithm 1 per chunk, chunks in parallel.

    Chunk ``c`` allocates samples ``[chunk_start[c], chunk_start[c + 1])`` with
    capacities ``chunk_capacity[c]``; each row of capacities must sum to its
    chunk's size.
    """
    cdef Py_ssize_t n_chunks = chunk_capacity.shape[0], n_samples = scores.shape[0]
    if chunk_start.shape[0] != n_chunks + 1 or chunk_start[0] != 0 or chunk_start[n_chunks] != n_samples:
        raise ValueError(f"chunk_start must run from 0 to {n_samples} in {n_chunks + 1} entries")
    if chunk_capacity.shape[1] != scores.shape[1]:
        raise ValueError(f"chunk_capacity: expected {scores.shape[1]} workers, got {chunk_capacity.shape[1]}")
    sums = np.asarray(chunk_capacity).sum(axis=1)
    sizes = np.diff(np.asarray(chunk_start))
    if not np.array_equal(sums, sizes):
        raise ValueError(f"chunk capacities sum to {sums.tolist()}, chunk sizes are {sizes.tolist()}")
    cdef int64_t[:, ::1] remaining = np.array(chunk_capacity, dtype=np.int64)
    alloc = np.empty(n_samples, dtype=np.int32)
    cdef int32_t[::1] out = alloc
    cdef Py_ssize_t c
    with nogil:
        for c in prange(n_chunks, num_threads=threads, schedule="dynamic"):
            allocate_range(scores, chunk_start[c], chunk_start[c + 1], &remaining[c, 0], seed, iteration, out, NULL)
    return alloc
