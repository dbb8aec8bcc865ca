# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Location-aware input allocation (Herald's Algorithm 1), exact and chunked.

Scoring reads the cluster state's per-row holder bitsets: the score of
sample ``i`` on worker ``w`` is the number of its rows whose latest value
``w`` holds (docs/design.md section 4). That costs samples x tables array reads
plus one step per holder bit, not samples x workers x tables set lookups.
A sample's scores are counted as it is placed, never stored: a row is fresh
on one worker or none, so the [samples, workers] matrix (8 MB at 128
workers) would be almost all zeros, written and read back from memory.

Allocation gives each sample, in order, to the highest-scoring worker that
still has capacity; ties go to a uniformly chosen tied worker, chosen by a
counter-based hash of (seed, iteration, sample), never by a stateful RNG.
The chunked form splits samples and capacities into a fixed number of chunks
that are allocated independently (in parallel, without locks), so its result
depends on the chunk count but never on the thread count.
"""
cimport cython
import numpy as np
from cython.parallel cimport parallel, prange, threadid
from libc.stdint cimport int8_t, int32_t, int64_t, uint64_t
from libc.stdlib cimport abort, calloc, free, malloc
from libc.string cimport memcpy, memset
from counter_hash cimport hash3


cdef extern from *:
    int ctz64 "__builtin_ctzll"(unsigned long long) nogil
    int popcount64 "__builtin_popcountll"(unsigned long long) nogil
    void prefetch "__builtin_prefetch"(const void*) nogil

cdef enum:
    TIE_STREAM = 0x7A1E
    COMMON = 2
    SWAP_TRIES = 4
    SWAP_ROOM = 8        # (row, worker) slots per batch entry when swapping: greedy fills at most 1/8
    MIN_TABLE = 4096     # entries of the smallest distinct-row table (BatchCosts)
    AHEAD = 8            # BatchCosts.merge_parts: table entries between a row's prefetch and its use


cdef void check_scoring(int words, int n_workers, Py_ssize_t n_tables, const int32_t[::1] tables) except *:
    """The holder words hold PS + workers, and ``tables`` name tables of the batch."""
    cdef Py_ssize_t k
    if words * 64 < n_workers + 1:
        raise ValueError(f"{words} holder words cannot hold PS + {n_workers} workers")
    for k in range(tables.shape[0]):
        if tables[k] < 0 or tables[k] >= n_tables:
            raise ValueError(f"tables[{k}] = {tables[k]} is not a table in [0, {n_tables})")


cdef inline void prefetch_holders(const uint64_t* holders, int words, const int64_t* rows, Py_ssize_t n_tables,
                                  const int32_t* tables, Py_ssize_t n_scored, Py_ssize_t i) noexcept nogil:
    """Start the (random) holder reads of sample ``i``'s rows, to overlap them with the work before its turn."""
    cdef Py_ssize_t k
    for k in range(n_scored):
        prefetch(&holders[rows[i * n_tables + tables[k]] * words])


cdef inline int add_worker(int w, int32_t* counts, int32_t* touched, int n_touched) noexcept nogil:
    """Add 1 to ``counts[w]``; list ``w`` in ``touched`` if its count was 0. Returns the count of ``touched``."""
    if counts[w] == 0:
        touched[n_touched] = w
        n_touched += 1
    counts[w] += 1
    return n_touched


cdef inline int add_fresh(const uint64_t* bits, int words, int32_t* counts, int32_t* touched,
                          int n_touched) noexcept nogil:
    """Add 1 to ``counts[w]`` of each worker ``w`` in one row's holder ``bits`` (not the PS); list in
    ``touched`` each worker whose count was 0. Returns the count of ``touched``."""
    cdef Py_ssize_t word
    cdef uint64_t x
    for word in range(words):
        x = bits[word]
        if word == 0:
            x = x & ~(<uint64_t>1)  # bit 0 is the PS
        while x:
            n_touched = add_worker(64 * word + ctz64(x) - 1, counts, touched, n_touched)
            x = x & (x - 1)
    return n_touched


cdef inline int count_fresh(const uint64_t* holders, int words, const int64_t* rows, Py_ssize_t n_tables,
                            const int32_t* tables, Py_ssize_t n_scored, Py_ssize_t i, int32_t* counts,
                            int32_t* touched) noexcept nogil:
    """Add to ``counts[w]`` the rows of sample ``i`` (C-ordered ``rows`` of ``n_tables``; the given
    tables) that worker ``w`` holds fresh; list in ``touched`` each worker whose count was 0, and
    return how many."""
    cdef Py_ssize_t k
    cdef int n_touched = 0
    for k in range(n_scored):
        n_touched = add_fresh(&holders[rows[i * n_tables + tables[k]] * words], words, counts, touched, n_touched)
    return n_touched


cdef inline int32_t take_margin(int32_t* counts, const int32_t* touched, int n_touched) noexcept nogil:
    """Second-best score less the best of 2 or more workers, of which only the ``touched`` score (the
    rest 0, which the initial best and second stand for); clears their counts for the next sample."""
    cdef int32_t best = 0, second = 0, x
    cdef int t
    for t in range(n_touched):
        x = counts[touched[t]]
        counts[touched[t]] = 0
        if x > best:
            best, second = x, best
        elif x > second:
            second = x
    return second - best


def fresh_margins(*, const uint64_t[::1] holders, int words, int n_workers, const int64_t[:, ::1] rows,
                  const int32_t[::1] tables, int threads=1):
    """Per sample, its second-best fresh-row count over the workers less its best (<= 0; 0 when the best
    is shared), as int32: the confident order's key. Each sample's counts go to a buffer of the thread's,
    and only the workers they touched are read back and cleared (see :func:`allocate_range`).
    """
    cdef Py_ssize_t n_samples = rows.shape[0], n_tables = rows.shape[1], i
    check_scoring(words, n_workers, n_tables, tables)
    out_array = np.zeros(n_samples, dtype=np.int32)
    cdef int32_t[::1] out = out_array
    cdef int32_t* counts
    cdef int32_t* touched
    cdef int n_touched
    if n_workers < 2 or n_samples == 0 or tables.shape[0] == 0:
        return out_array
    with nogil, parallel(num_threads=threads):
        counts = <int32_t*>calloc(n_workers, sizeof(int32_t))
        touched = <int32_t*>malloc(n_workers * sizeof(int32_t))
        if counts == NULL or touched == NULL:
            abort()
        for i in prange(n_samples, schedule="static"):
            if i + 1 < n_samples:
                prefetch_holders(&holders[0], words, &rows[0, 0], n_tables, &tables[0], tables.shape[0], i + 1)
            n_touched = count_fresh(&holders[0], words, &rows[0, 0], n_tables, &tables[0], tables.shape[0], i,
                                    counts, touched)
            out[i] = take_margin(counts, touched, n_touched)
        free(counts)
        free(touched)
    return out_array


def margin_order(gaps):
    """Samples by the margin of their best worker over the second best, largest first (ties: batch order).

    ``gaps``: per sample, second-best score less best (:func:`fresh_margins`).
    A sample whose rows one worker holds far more of than any other gains
    the most from going there; taken first, it is not pushed elsewhere by a
    worker that filled up with samples that any worker would have served.
    Margins lie in [-tables, 0], so a counting sort orders them in two
    passes over the batch (16,384 samples: NumPy's stable sort of int16,
    itself a radix sort, took 0.11-0.12 ms, serial on every rank).
    """
    cdef const int32_t[::1] g = np.ascontiguousarray(gaps, dtype=np.int32)
    cdef Py_ssize_t n = g.shape[0], i
    order_array = np.empty(n, dtype=np.int64)
    if n == 0:
        return order_array
    cdef int64_t[::1] order = order_array
    cdef int32_t lo = g[0], hi = g[0]
    for i in range(n):
        lo = min(lo, g[i])
        hi = max(hi, g[i])
    if <int64_t>hi - lo >= n:  # wider than the batch: the counts would cost more than a sort
        return np.argsort(np.asarray(g), kind="stable").astype(np.int64)
    cdef int64_t[::1] start = np.zeros(<int64_t>hi - lo + 2, dtype=np.int64)
    with nogil:
        for i in range(n):
            start[g[i] - lo + 1] += 1
        for i in range(1, start.shape[0]):
            start[i] += start[i - 1]
        for i in range(n):  # in batch order: ties keep it
            order[start[g[i] - lo]] = i
            start[g[i] - lo] += 1
    return order_array


cdef inline int64_t nth_set_bit(const uint64_t* bits, int64_t n) noexcept nogil:
    """Position of set bit ``n`` (from 0, lowest first) of the bit array ``bits``; the caller knows it exists."""
    cdef int64_t k = 0
    cdef uint64_t x
    while n >= popcount64(bits[k]):
        n -= popcount64(bits[k])
        k += 1
    x = bits[k]
    while n > 0:
        x &= x - 1
        n -= 1
    return 64 * k + ctz64(x)


cdef void allocate_range(const uint64_t* holders, int words, int n_workers, const int64_t* rows,
                         Py_ssize_t n_tables, const int32_t* tables, Py_ssize_t n_scored,
                         int64_t first, int64_t last, int64_t* remaining, uint64_t seed, uint64_t iteration,
                         int32_t* alloc, const int64_t* order) noexcept nogil:
    """Algorithm 1 on samples [first, last) with per-worker ``remaining`` capacity, scoring as it goes.

    ``order`` (or NULL: as they come) gives the sample taken at each step; a
    tie is broken by a hash of the sample, not of the step, so the choice
    for a sample does not depend on where the order puts it. A sample's
    scores are counted from the holder bits of its rows into a buffer of
    this call's: a row has one or no worker holding it fresh (two after a
    P2P send), so a sample scores on a handful of workers, and only those
    are read and cleared. Every other open worker scores 0, so when no
    scoring worker is open the pick is among all open ones (a bit array).
    The result is that of the dense form: the best score over the open
    workers, and the tied worker the hash picks, in worker order.
    """
    cdef int64_t j, i, ties, pick, n_open = 0
    cdef int32_t best
    cdef int w, t, u, n_touched, lowest
    cdef uint64_t stream = iteration * <uint64_t>0x100000001B3ULL + TIE_STREAM
    cdef int open_words = (n_workers + 63) // 64
    cdef int32_t* counts = <int32_t*>calloc(max(1, n_workers), sizeof(int32_t))
    cdef int32_t* touched = <int32_t*>malloc(max(1, n_workers) * sizeof(int32_t))
    cdef uint64_t* is_open = <uint64_t*>calloc(max(1, open_words), sizeof(uint64_t))
    if counts == NULL or touched == NULL or is_open == NULL:
        abort()
    for w in range(n_workers):
        if remaining[w] > 0:
            is_open[w >> 6] |= (<uint64_t>1) << (w & 63)
            n_open += 1
    for j in range(first, last):
        if j + 2 < last:  # overlap a later sample's holder reads
            prefetch_holders(holders, words, rows, n_tables, tables, n_scored, order[j + 2] if order != NULL else j + 2)
        i = order[j] if order != NULL else j
        n_touched = count_fresh(holders, words, rows, n_tables, tables, n_scored, i, counts, touched)
        best = 0
        ties = 0
        for t in range(n_touched):
            w = touched[t]
            if remaining[w] > 0:
                if counts[w] > best:
                    best, ties = counts[w], 0
                if counts[w] == best:
                    ties += 1
        if best > 0:  # the pick-th tied worker in worker order: the lowest tied one above the last, pick times
            pick = <int64_t>(hash3(seed, stream, <uint64_t>i) % <uint64_t>ties)
            w = -1
            for u in range(pick + 1):
                lowest = n_workers
                for t in range(n_touched):
                    if touched[t] > w and touched[t] < lowest and counts[touched[t]] == best \
                            and remaining[touched[t]] > 0:
                        lowest = touched[t]
                w = lowest
        else:  # every open worker scores 0: all of them tie
            pick = <int64_t>(hash3(seed, stream, <uint64_t>i) % <uint64_t>n_open)
            w = <int>nth_set_bit(is_open, pick)
        alloc[i] = <int32_t>w
        remaining[w] -= 1
        if remaining[w] == 0:
            is_open[w >> 6] &= ~((<uint64_t>1) << (w & 63))
            n_open -= 1
        for t in range(n_touched):
            counts[touched[t]] = 0
    free(counts)
    free(touched)
    free(is_open)


def checked_order(capacity, Py_ssize_t n_samples, Py_ssize_t n_workers, order):
    """Check that ``capacity`` gives ``n_workers`` room for exactly the samples, and ``order`` (or None)
    is a permutation of them; returns the order as a contiguous int64 array (empty for None: as they come)."""
    if capacity.shape[0] != n_workers:
        raise ValueError(f"capacity: expected {n_workers} workers, got {capacity.shape[0]}")
    if np.asarray(capacity).sum() != n_samples:
        raise ValueError(f"capacities sum to {np.asarray(capacity).sum()}, expected {n_samples} samples")
    if order is None:
        return np.zeros(0, dtype=np.int64)
    steps = np.ascontiguousarray(order, dtype=np.int64)
    if steps.shape[0] != n_samples or not np.array_equal(np.sort(steps), np.arange(n_samples)):
        raise ValueError(f"order must be a permutation of the {n_samples} samples")
    return steps


def allocate_exact(*, const uint64_t[::1] holders, int words, int n_workers, const int64_t[:, ::1] rows,
                   const int32_t[::1] tables, const int64_t[::1] capacity, uint64_t seed, uint64_t iteration,
                   order=None):
    """Herald's Algorithm 1, sequential over samples (in ``order``, a permutation, if given): each sample
    to the open worker holding most of its rows (in ``tables``) fresh. Returns int32 worker per sample."""
    cdef Py_ssize_t n_samples = rows.shape[0], n_tables = rows.shape[1]
    check_scoring(words, n_workers, n_tables, tables)
    cdef int64_t[::1] steps = checked_order(capacity, n_samples, n_workers, order)
    cdef const int64_t* taken = &steps[0] if steps.shape[0] else NULL
    cdef int64_t[::1] remaining = np.array(capacity, dtype=np.int64)
    alloc = np.empty(n_samples, dtype=np.int32)
    cdef int32_t[::1] out = alloc
    cdef Py_ssize_t n_scored = tables.shape[0] if n_tables else 0
    if n_samples == 0:
        return alloc
    with nogil:
        allocate_range(&holders[0], words, n_workers, &rows[0, 0] if n_tables else NULL, n_tables,
                       &tables[0] if n_scored else NULL, n_scored, 0, n_samples, &remaining[0], seed, iteration,
                       &out[0], taken)
    return alloc


def allocate_chunked(*, const uint64_t[::1] holders, int words, int n_workers, const int64_t[:, ::1] rows,
                     const int32_t[::1] tables, const int64_t[:, ::1] chunk_capacity,
                     const int64_t[::1] chunk_start, uint64_t seed, uint64_t iteration, int threads=1):
    """Algorithm 1 per chunk, chunks in parallel.

    Chunk ``c`` allocates samples ``[chunk_start[c], chunk_start[c + 1])`` with
    capacities ``chunk_capacity[c]``; each row of capacities must sum to its
    chunk's size.
    """
    cdef Py_ssize_t n_chunks = chunk_capacity.shape[0], n_samples = rows.shape[0], n_tables = rows.shape[1]
    check_scoring(words, n_workers, n_tables, tables)
    if chunk_start.shape[0] != n_chunks + 1 or chunk_start[0] != 0 or chunk_start[n_chunks] != n_samples:
        raise ValueError(f"chunk_start must run from 0 to {n_samples} in {n_chunks + 1} entries")
    if chunk_capacity.shape[1] != n_workers:
        raise ValueError(f"chunk_capacity: expected {n_workers} workers, got {chunk_capacity.shape[1]}")
    sums = np.asarray(chunk_capacity).sum(axis=1)
    sizes = np.diff(np.asarray(chunk_start))
    if not np.array_equal(sums, sizes):
        raise ValueError(f"chunk capacities sum to {sums.tolist()}, chunk sizes are {sizes.tolist()}")
    cdef int64_t[:, ::1] remaining = np.array(chunk_capacity, dtype=np.int64)
    alloc = np.empty(n_samples, dtype=np.int32)
    cdef int32_t[::1] out = alloc
    cdef Py_ssize_t c, n_scored = tables.shape[0] if n_tables else 0
    if n_samples == 0:
        return alloc
    cdef const int64_t* row_ids = &rows[0, 0] if n_tables else NULL
    cdef const int32_t* scored = &tables[0] if n_scored else NULL
    with nogil:
        for c in prange(n_chunks, num_threads=threads, schedule="dynamic"):
            allocate_range(&holders[0], words, n_workers, row_ids, n_tables, scored, n_scored, chunk_start[c],
                           chunk_start[c + 1], &remaining[c, 0], seed, iteration, &out[0], NULL)
    return alloc


cdef int64_t LOW32 = (<int64_t>1 << 32) - 1


cdef int table_bits(int64_t entries) noexcept nogil:
    """log2 of the smallest power of two >= ``entries`` (at least 1)."""
    cdef int bits = 0
    while (<int64_t>1 << bits) < entries:
        bits += 1
    return bits


cdef inline int64_t fib_slot(int64_t key, int64_t mask) noexcept nogil:
    """Home of ``key`` in a power-of-two table of ``mask + 1`` entries (as :func:`probe`)."""
    return <int64_t>((<uint64_t>key * <uint64_t>0x9E3779B97F4A7C15ULL) >> 20) & mask


cdef inline int64_t probe(int64_t[::1] keys, int64_t mask, int64_t key) noexcept nogil:
    """Slot of ``key`` in an open-addressing table of int64 keys (-1 = empty): its own or the empty one to fill."""
    cdef int64_t h = fib_slot(key, mask)
    while keys[h] != -1 and keys[h] != key:
        h = (h + 1) & mask
    return h


cdef struct Delta:
    # a block's own placements this round, over the records (place_blocks): per row it touched, its new
    # misses and trainer bits. Open addressing, at most half full. An entry (stride words) is KEY = round << 32
    # | the batch's row index, MISS, then the bits; it is this round's if its key says so, so that a new round
    # starts without clearing the table.
    uint64_t* entries
    int64_t stride, mask, round
    int64_t* slots       # the entries costs() found for the sample being placed, one per row: block_move's


cdef enum:
    KEY = 0
    MISS = 1
    BITS = 2


cdef inline bint delta_taken(const Delta* delta, int64_t h) noexcept nogil:
    return (<int64_t>delta.entries[h * delta.stride + KEY] >> 32) == delta.round


cdef inline bint delta_has(const Delta* delta, int64_t h, int64_t u) noexcept nogil:
    return <int64_t>delta.entries[h * delta.stride + KEY] == ((delta.round << 32) | u)


cdef inline int64_t delta_slot(const Delta* delta, int64_t h, int64_t u) noexcept nogil:
    """Row ``u``'s entry in ``delta`` this round, or the free one where it would go, probing from entry ``h``."""
    while delta_taken(delta, h) and not delta_has(delta, h, u):
        h = (h + 1) & delta.mask
    return h


cdef enum:
    OWNER = 1            # int32 fields at the head of a row record (see BatchCosts; 0 and 3 unused)
    N_MISS = 2
    HEAD = 2             # uint64 words the int32 fields take: a record of 3 holder words fills 64 bytes


@cython.final  # cdef methods called directly, so the C compiler inlines them
cdef class CostScratch:
    """The memory of a :class:`BatchCosts`, kept from batch to batch (one live BatchCosts at a time).

    A batch's tables and records take tens of MB when sized for every entry;
    fresh pages each batch cost the kernel's page clearing more than the
    scoring itself. Kept and sized by the distinct rows, they fit the caches.
    """
    cdef int64_t[::1] keys                   # table t (0: the batch's, 1 + p: part p's), entry h at
                                             # [2 (t size + h)]: row << 32 | index (-1: free), then its uses
    cdef int64_t last_distinct               # distinct rows of the last batch: sizes the next tables
    cdef int32_t[::1] ids, seen, live, local, sole
    cdef int64_t[::1] distinct
    cdef object record_memory
    cdef uint64_t* records                   # 64-byte aligned
    cdef dict block_memory                   # place_blocks' arrays by name

    def __init__(self):
        self.block_memory = {}
        self.keys = np.full(16, -1, dtype=np.int64)
        self.last_distinct = 0
        self.ids = np.zeros(1, dtype=np.int32)
        self.seen = np.zeros(1, dtype=np.int32)
        self.sole = np.zeros(1, dtype=np.int32)
        self.live = np.zeros(1, dtype=np.int32)
        self.local = np.zeros(1, dtype=np.int32)
        self.distinct = np.zeros(1, dtype=np.int64)
        self.record_memory = None

    cdef object kept(self, str name, tuple shape, dtype, fill):
        """:func:`place_blocks`' array ``name``: the last call's if it is at least this shape (its rows then
        longer than asked), else a new one of ``fill``."""
        array = self.block_memory.get(name)
        if array is None or array.dtype != dtype or array.ndim != len(shape) or \
                any(have < want for have, want in zip(array.shape, shape)):
            array = self.block_memory[name] = np.full(shape, fill, dtype=dtype)
        return array

    cdef void reserve(self, int64_t samples, int64_t entries, int parts, int64_t size, int64_t stride):
        """Room for a batch of ``samples`` x tables = ``entries`` in ``parts``: 1 + ``parts`` tables of
        ``size`` entries (free), half as many rows per table, records of ``stride`` words."""
        cdef uint64_t[::1] memory
        cdef int64_t rows = size // 2, words = 2 * (1 + parts) * size
        if self.keys.shape[0] != words:
            self.keys = np.empty(words, dtype=np.int64)
        with nogil:
            memset(&self.keys[0], 0xFF, words * sizeof(int64_t))  # -1: free
        if self.ids.shape[0] < entries:
            self.ids = np.empty(entries, dtype=np.int32)
        if self.live.shape[0] < samples:
            self.live = np.empty(samples, dtype=np.int32)
        if self.local.shape[0] < parts * rows:
            self.local = np.empty(parts * rows, dtype=np.int32)
        if self.seen.shape[0] < rows:
            self.seen = np.empty(rows, dtype=np.int32)
            self.sole = np.empty(rows, dtype=np.int32)
            self.distinct = np.empty(rows, dtype=np.int64)
        if self.record_memory is None or len(self.record_memory) < rows * stride + 8:
            self.record_memory = np.empty(rows * stride + 8, dtype=np.uint64)  # filled at first sight
            memory = self.record_memory
            self.records = &memory[(8 - (<size_t>&memory[0] // 8) % 8) % 8]


@cython.final  # cdef methods called directly, so the C compiler inlines them
cdef class BatchCosts:
    """The distinct rows of one global batch, who trains them, and what a placement adds (:func:`allocate_cost`).

    Everything is sized by the batch (samples x tables), never by the tables
    or the caches. Per distinct row how often the batch uses it, and one
    record, so that reading a row costs one cache miss: its dirty owner, how
    many of its trainers pull it, its holder bits (copied from the cluster
    state) and the workers training it in this batch (same bit layout as the
    holders).
    With ``pair_room`` above 2 it also counts, per (row, worker), the samples
    placed there that use the row, so that a sample can be moved back
    (:meth:`can_move`, the swap pass); greedy placement alone needs only the bits.
    """
    cdef int n_workers, words, n_tables
    cdef int64_t n_samples
    cdef int64_t full_set, common, n_distinct, mask, pair_mask, pair_used, stamp, stride
    cdef int64_t limit                       # distinct rows a table takes (half its entries)
    cdef int parts                           # threads' shares of the samples, each with a table of its own
    cdef int64_t[::1] part_rows              # [8p]: part p's distinct rows (a cache line each), -1: its table filled
    cdef bint counts_pairs
    cdef int64_t n_slices                    # bits of the largest saving of a sample (3 per table)
    cdef int64_t[::1] keys, pair_keys, extra
    cdef uint64_t[::1] saving                # costs(): n_slices x words
    cdef int32_t[::1] ids, seen, pair_count, visited
    cdef int32_t[::1] sole                   # per distinct row: its one fresh worker, -1 none, -2 several
    cdef int32_t[::1] live                   # per sample: its rows not common come first in ids, this many
    cdef int32_t[::1] local                  # part p's index u -> the batch's index, at [p * limit + u]
    cdef CostScratch scratch
    cdef uint64_t* records                   # stride words per distinct row: HEAD, fresh[words], trains[words]
    cdef BatchCosts previous
    cdef const int64_t[:, ::1] rows          # the batch's global row ids (kept: shaping may come later)
    cdef const int32_t[::1] tables
    cdef int64_t[::1] distinct               # per distinct row: its row id
    cdef int64_t most                        # entries of the largest table shaping may need
    cdef int pair_room
    cdef readonly bint shaped                # its distinct rows found (shape)
    cdef readonly bint bound                 # its records made from the holders (bind)
    cdef bint shaped_beside                  # set by shape_pass beside the greedy placement of another batch

    def __init__(self, const uint64_t[::1] holders, int words, int n_workers, const int64_t[:, ::1] rows,
                 const int32_t[::1] tables, bint full_set, BatchCosts previous=None, int pair_room=2,
                 int threads=1, CostScratch scratch=None):
        """``pair_room``: (row, worker) slots per entry of the batch; above 2, room for moves (:meth:`can_move`).
        ``threads`` find the distinct rows (the costs do not depend on it). ``scratch``: memory to reuse
        (this board then owns it until another takes it).

        ``holders`` None: a board of a batch whose holders are not known yet
        (the next one): :func:`allocate_cost` shapes it beside the greedy
        placement of the batch before (``beside``) and binds it when its turn comes.
        """
        cdef Py_ssize_t n_samples = rows.shape[0]
        check_scoring(words, n_workers, rows.shape[1], tables)
        self.n_workers, self.words, self.n_tables, self.full_set = n_workers, words, tables.shape[0], full_set
        self.n_samples = n_samples
        self.rows, self.tables = rows, tables
        self.common = COMMON * n_workers
        cdef int64_t entries = max(1, n_samples * self.n_tables), size = 16, pair_size = 16
        while size < 2 * entries:
            size <<= 1
        self.most = size
        self.pair_room, self.counts_pairs = pair_room, pair_room > 2
        while self.counts_pairs and pair_size < pair_room * entries:
            pair_size <<= 1
        self.pair_mask, self.pair_used = pair_size - 1, 0
        self.pair_keys = np.full(pair_size, -1, dtype=np.int64)
        self.pair_count = np.zeros(pair_size, dtype=np.int32)
        self.stride = HEAD + 2 * words
        # records aligned to 64 bytes: with up to 191 workers (3 words) a record is one cache line
        self.scratch = CostScratch() if scratch is None else scratch
        self.extra = np.zeros(n_workers, dtype=np.int64)
        self.n_slices = 1
        while (1 << self.n_slices) <= 3 * max(1, self.n_tables):
            self.n_slices += 1
        self.saving = np.zeros(self.n_slices * words, dtype=np.uint64)
        self.stamp = 0
        self.parts = max(1, min(threads, n_samples))
        self.part_rows = np.zeros(8 * self.parts, dtype=np.int64)
        self.shaped = self.bound = self.shaped_beside = False
        if holders is not None:
            self.shape(threads)
            self.bind(holders, previous, threads)

    cdef void check_settings(self, int words, int n_workers, bint full_set, int pair_room) except *:
        """Refuse this board for a call with other settings, or a second placement (a board is placed once)."""
        if self.bound:
            raise ValueError("board: placed already (a board serves one allocation)")
        if (words, n_workers, full_set, pair_room) != (self.words, self.n_workers, bool(self.full_set),
                                                       self.pair_room):
            raise ValueError(f"board: made for words={self.words}, n_workers={self.n_workers}, "
                             f"full_set={bool(self.full_set)}, pair_room={self.pair_room}; the call has "
                             f"{words}, {n_workers}, {full_set}, {pair_room}")

    cdef void check_made_for(self, const int64_t[:, ::1] rows, const int32_t[::1] tables, int words,
                             int n_workers, bint full_set, int pair_room) except *:
        """:meth:`check_settings`, and refuse this board for a call about another batch or other tables."""
        cdef Py_ssize_t k
        self.check_settings(words, n_workers, full_set, pair_room)
        if rows.shape[0] != self.rows.shape[0] or rows.shape[1] != self.rows.shape[1] or \
                (rows.shape[0] * rows.shape[1] and &rows[0, 0] != &self.rows[0, 0]):
            raise ValueError("board: made for another batch than rows")
        same = tables.shape[0] == self.tables.shape[0]
        for k in range(tables.shape[0] if same else 0):
            same = same and tables[k] == self.tables[k]
        if not same:
            raise ValueError("board: made for other tables than tables")

    cdef int64_t first_size(self):
        """Entries of the first distinct-row table to try: for the distinct rows the last batch had, not
        for the batch's entries. Batches repeat rows (Criteo-like: 1 distinct row in 15 to 45 entries),
        and tables that fit the caches save a miss per entry. One that fills up is rebuilt four times larger."""
        return min(self.most, max(MIN_TABLE, 1 << (1 + table_bits(self.scratch.last_distinct))))

    cdef void shape(self, int threads) except *:
        """Find the batch's distinct rows with ``threads`` (rows only: no holder is read)."""
        cdef int64_t size = self.first_size()
        cdef bint ok = False
        while True:
            self.reserve(size)
            with nogil:
                ok = self.shape_pass(threads)
            if ok:
                break
            if size == self.most:  # a table holds every entry at load <= 1/2: cannot fill
                raise RuntimeError(f"the distinct-row table of {size} entries filled")
            size = min(4 * size, self.most)
        self.finish_shape()

    cdef void reserve(self, int64_t size) except *:
        """The scratch memory for tables of ``size`` entries, taken as this board's (needs the GIL)."""
        self.limit = size // 2
        self.mask = size - 1
        self.scratch.reserve(self.n_samples, max(1, self.n_samples * self.n_tables), self.parts, size, self.stride)
        self.keys, self.ids, self.seen, self.records, self.local, self.sole, self.live, self.distinct = \
            self.scratch.keys, self.scratch.ids, self.scratch.seen, self.scratch.records, self.scratch.local, \
            self.scratch.sole, self.scratch.live, self.scratch.distinct

    cdef void finish_shape(self) except *:
        self.scratch.last_distinct = self.n_distinct
        self.visited = np.zeros(self.limit if self.counts_pairs else 1, dtype=np.int32)  # the swap pass's
        self.shaped = True

    cdef bint shape_pass(self, int threads) noexcept nogil:
        """The distinct rows and their uses in the reserved tables; False if one filled past half.

        Each thread takes a contiguous share of the samples and counts its
        rows in a table of its own (no entry, count or cache line is
        shared, nothing is atomic); then one pass merges the parts' tables
        into the batch's; then each sample's entries become the batch's
        indices, the rows not common first.
        """
        cdef int p
        cdef int64_t i, n_samples = self.n_samples
        for p in prange(self.parts, num_threads=threads, schedule="static", chunksize=1):
            self.part_rows[8 * p] = self.count_part(self.rows, self.tables, p, self.first_sample(p, n_samples),
                                                    self.first_sample(p + 1, n_samples))
        for p in range(self.parts):
            if self.part_rows[8 * p] < 0:
                return False
        if not self.merge_parts():
            return False
        for p in prange(self.parts, num_threads=threads, schedule="static", chunksize=1):
            for i in range(self.first_sample(p, n_samples), self.first_sample(p + 1, n_samples)):
                self.live[i] = self.index_sample(i, p)
        return True

    cdef void bind(self, const uint64_t[::1] holders, BatchCosts previous, int threads) except *:
        """Each distinct row's record from the holders (as ``previous`` leaves them, if given)."""
        cdef int64_t u, n = self.n_distinct
        cdef const uint64_t* at = &holders[0]
        self.previous = previous
        with nogil:
            for u in prange(n, num_threads=threads, schedule="static"):
                if u + AHEAD < n:
                    prefetch(&at[self.distinct[u + AHEAD] * self.words])
                self.new_record(at, self.distinct[u], u)
        self.bound = True

    cdef inline int64_t first_sample(self, int p, int64_t n_samples) noexcept nogil:
        """Part ``p``'s samples start here (the parts split the batch into contiguous ranges)."""
        return p * n_samples // self.parts

    cdef int64_t count_part(self, const int64_t[:, ::1] rows, const int32_t[::1] tables, int p, int64_t first,
                            int64_t last) noexcept nogil:
        """Part ``p``'s samples ``[first, last)``: each entry's index in the part's table (into ``ids``)
        and each row's uses; returns the part's distinct rows (-1: its table filled)."""
        cdef int64_t table = (1 + p) * (self.mask + 1), i, k, row, h, entry, n = 0
        for i in range(first, last):
            if i + 2 < last:  # the table entries of the sample after next (cached: latency only)
                for k in range(self.n_tables):
                    prefetch(&self.keys[2 * (table + fib_slot(rows[i + 2, tables[k]], self.mask))])
            for k in range(self.n_tables):
                row = rows[i, tables[k]]
                h = fib_slot(row, self.mask)
                while True:
                    entry = self.keys[2 * (table + h)]
                    if entry == -1:
                        if n == self.limit:
                            return -1
                        entry = (row << 32) | n
                        self.keys[2 * (table + h)] = entry
                        self.keys[2 * (table + h) + 1] = 0
                        self.local[p * self.limit + n] = <int32_t>h  # where merge_parts finds it
                        n += 1
                        break
                    if (entry >> 32) == row:
                        break
                    h = (h + 1) & self.mask
                self.keys[2 * (table + h) + 1] += 1  # the count, beside the key: no second miss
                self.ids[i * self.n_tables + k] = <int32_t>(entry & LOW32)
        return n

    cdef bint merge_parts(self) noexcept nogil:
        """The parts' rows into the batch's table (0), in part order: each part's index -> the batch's
        (``local``, which :meth:`count_part` left holding each index's entry in the part's table), uses
        summed (``seen``, up to ``common``), each new row's id (``distinct``). False if it filled.

        It reads the parts' rows in the order they were found, not their
        whole tables: with 16 parts the tables hold 16 times the batch's
        entries, and scanning them took 1.15 ms a batch (measured).
        """
        cdef int p
        cdef int64_t h, g, entry, row, u, x, n = 0, size = self.mask + 1, base
        for p in range(self.parts):
            base = (1 + p) * size
            for x in range(self.part_rows[8 * p]):
                if x + 2 * AHEAD < self.part_rows[8 * p]:
                    prefetch(&self.keys[2 * (base + self.local[p * self.limit + x + 2 * AHEAD])])
                if x + AHEAD < self.part_rows[8 * p]:
                    entry = self.keys[2 * (base + self.local[p * self.limit + x + AHEAD])]
                    prefetch(&self.keys[2 * fib_slot(entry >> 32, self.mask)])
                h = base + self.local[p * self.limit + x]
                entry = self.keys[2 * h]
                row = entry >> 32
                g = fib_slot(row, self.mask)
                while self.keys[2 * g] != -1 and (self.keys[2 * g] >> 32) != row:
                    g = (g + 1) & self.mask
                if self.keys[2 * g] == -1:
                    if n == self.limit:
                        return False
                    self.keys[2 * g] = (row << 32) | n
                    self.seen[n] = 0
                    self.distinct[n] = row
                    n += 1
                u = self.keys[2 * g] & LOW32
                self.local[p * self.limit + (entry & LOW32)] = <int32_t>u
                self.seen[u] = <int32_t>min(self.seen[u] + self.keys[2 * h + 1], self.common)
        self.n_distinct = n
        return True

    cdef void new_record(self, const uint64_t* holders, int64_t row, int64_t u) noexcept nogil:
        """Row ``row``'s record ``u``: its holders (as the previous batch leaves them, if any), its dirty
        owner, no trainers yet (the record's memory is not cleared beforehand); and its ``sole`` fresh
        worker, which :meth:`margins` reads instead of the record."""
        cdef int64_t word, workers = 0, worker = -1
        cdef uint64_t x
        cdef bint on_ps = False
        for word in range(self.words):
            x = holders[row * self.words + word]
            if self.previous is not None:
                x = self.previous.holders_after(row, word, x)
            self.fresh(u)[word] = x
            self.trains(u)[word] = 0
            if word == 0:
                on_ps = x & 1
                x &= ~(<uint64_t>1)  # workers only
            if x:
                workers += popcount64(x)
                worker = 64 * word + ctz64(x) - 1
        for word in range(HEAD):
            self.record(u)[word] = 0
        self.fields(u)[OWNER] = <int32_t>worker if workers == 1 and not on_ps else -1
        self.sole[u] = <int32_t>(-1 if workers == 0 else (worker if workers == 1 else -2))

    cdef int32_t index_sample(self, int64_t i, int p) noexcept nogil:
        """Sample ``i`` (of part ``p``): its entries as the batch's row indices in ``ids``, the rows that
        are not common first; returns their count.

        A common row costs no worker anything (:meth:`costs`), so placing
        and scoring read only the others (a third of the entries of a
        Criteo-like batch over 128 workers). Their order does not matter:
        costs are sums.
        """
        cdef int64_t k, base = i * self.n_tables
        cdef int32_t n = 0, u
        for k in range(self.n_tables):
            u = self.local[p * self.limit + self.ids[base + k]]
            if self.seen[u] < self.common:
                self.ids[base + k] = self.ids[base + n]
                self.ids[base + n] = u
                n += 1
            else:
                self.ids[base + k] = u
        return n

    cdef inline uint64_t* record(self, int64_t u) noexcept nogil:
        return self.records + u * self.stride

    cdef inline int32_t* fields(self, int64_t u) noexcept nogil:
        return <int32_t*>(self.records + u * self.stride)

    cdef inline uint64_t* fresh(self, int64_t u) noexcept nogil:
        return self.records + u * self.stride + HEAD

    cdef inline uint64_t* trains(self, int64_t u) noexcept nogil:
        return self.records + u * self.stride + HEAD + self.words

    cdef inline int64_t find(self, int64_t row) noexcept nogil:
        """Index of ``row`` among the batch's distinct rows, or -1."""
        cdef int64_t h = fib_slot(row, self.mask), entry
        while True:
            entry = self.keys[2 * h]
            if entry == -1:
                return -1
            if (entry >> 32) == row:
                return entry & LOW32
            h = (h + 1) & self.mask

    cdef uint64_t holders_after(self, int64_t row, int64_t word, uint64_t now) noexcept nogil:
        """Word ``word`` of ``row``'s holders once this batch is trained as placed (``now``: before it).

        As the state's update (docs/design.md section 3): a row one worker
        trains is then fresh there only (full set: there and on the PS), a row
        several workers train is fresh on the PS only. Evictions are ignored.
        """
        cdef int64_t u = self.find(row), k, trainers = 0
        if u < 0:
            return now
        for k in range(self.words):
            trainers += popcount64(self.trains(u)[k])
        if trainers >= 2:
            return 1 if word == 0 else 0
        return self.trains(u)[word] | (1 if word == 0 and self.full_set else 0)

    cdef int64_t batch_cost(self) noexcept nogil:
        """This batch's reads as placed: the sum of :meth:`row_cost` over its distinct rows."""
        cdef int64_t u, total = 0
        for u in range(self.n_distinct):
            total += self.row_cost(u)
        return total

    def margins(self, int threads=1):
        """:func:`fresh_margins` of the batch, read from ``sole`` (4 bytes per distinct row) rather than
        the holders (every row of the tables): at 128 workers a row is fresh on one worker or none, and
        only a row fresh on several reads its record."""
        cdef int64_t i
        out_array = np.zeros(self.n_samples, dtype=np.int32)
        cdef int32_t[::1] out = out_array
        cdef int32_t* counts
        cdef int32_t* touched
        cdef int k, n_touched, w
        cdef int32_t u
        if self.n_workers < 2 or self.n_tables == 0:
            return out_array
        with nogil, parallel(num_threads=threads):
            counts = <int32_t*>calloc(self.n_workers, sizeof(int32_t))
            touched = <int32_t*>malloc(self.n_workers * sizeof(int32_t))
            if counts == NULL or touched == NULL:
                abort()
            for i in prange(self.n_samples, schedule="static"):
                n_touched = 0
                for k in range(self.n_tables):
                    u = self.ids[i * self.n_tables + k]
                    w = self.sole[u]
                    if w >= 0:
                        n_touched = add_worker(w, counts, touched, n_touched)
                    elif w == -2:
                        n_touched = add_fresh(self.fresh(u), self.words, counts, touched, n_touched)
                out[i] = take_margin(counts, touched, n_touched)
            free(counts)
            free(touched)
        return out_array

    cdef inline void prefetch_ids(self, int64_t i) noexcept nogil:
        """Start reading sample ``i``'s row indices: :meth:`costs` of the sample before it prefetches the
        records they name, and in the confident order the samples come at random."""
        cdef int64_t k, base = i * self.n_tables
        for k in range(0, self.n_tables, 16):
            prefetch(&self.ids[base + k])
        prefetch(&self.ids[base + self.n_tables - 1])

    cdef int64_t costs(self, int64_t i, int64_t next_i, uint64_t* saving, const Delta* delta=NULL) noexcept nogil:
        """What placing sample ``i`` adds on worker ``w``: ``total`` (returned) less ``D[w]``, the reads
        ``w`` saves because it holds or already trains some of ``i``'s rows.

        ``D`` comes as bit slices in the holders' bit layout: bit ``w + 1``
        of ``saving[s * words + k]`` (word ``k``) is bit ``s`` of ``D[w]``.
        Each row adds its saving to all its workers at once (a ripple-carry
        add of one word), whatever their number, and the cheapest workers
        are then found by a few word operations (:func:`cheapest`).
        ``next_i``: the sample placed after ``i`` (its records are prefetched; -1: none). ``delta``: a
        block's own placements this round (:func:`place_blocks`), seen on top of the records; NULL: none.
        """
        cdef int64_t total = 0, base, k, u, word, d = -1
        cdef uint64_t fresh, trained
        cdef int32_t* f
        cdef int32_t n_miss
        for k in range(self.n_slices * self.words):
            saving[k] = 0
        if next_i >= 0:  # overlap the next sample's record misses
            for k in range(self.live[next_i]):
                prefetch(self.record(self.ids[next_i * self.n_tables + k]))
        for k in range(self.live[i]):  # the rows that are not common
            u = self.ids[i * self.n_tables + k]
            f = self.fields(u)
            n_miss = f[N_MISS]
            if delta != NULL:
                d = delta_slot(delta, fib_slot(u, delta.mask), u)
                delta.slots[k] = d
                if delta_has(delta, d, u):
                    n_miss = n_miss + <int32_t>delta.entries[d * delta.stride + MISS]
                else:
                    d = -1
            base = 1 + self.full_set + (1 if f[OWNER] >= 0 and n_miss == 0 else 0)
            total += base
            for word in range(self.words):
                trained = self.trains(u)[word] | (delta.entries[d * delta.stride + BITS + word] if d >= 0 else 0)
                fresh = self.fresh(u)[word] & (~(<uint64_t>1) if word == 0 else ~(<uint64_t>0))  # not the PS
                if self.full_set:  # a trainer saves its pull and push, a fresh holder its pull
                    self.add_saving(saving, word, trained, base)
                    self.add_saving(saving, word, fresh & ~trained, base - 1)
                else:  # a trainer or a fresh holder saves the pull (and the owner's push)
                    self.add_saving(saving, word, trained | fresh, base)
        return total

    cdef inline void add_saving(self, uint64_t* saving, int64_t word, uint64_t workers, int64_t amount) noexcept nogil:
        """Add ``amount`` (< 4) to ``D`` of ``workers`` (a word of bits): ripple-carry adds into the slices."""
        cdef int64_t j, s
        cdef uint64_t carry, t
        for j in range(2):
            if (amount >> j) & 1:
                carry = workers
                s = j
                while carry:  # n_slices hold the largest sum, so the carry ends within them
                    t = saving[s * self.words + word] & carry
                    saving[s * self.words + word] ^= carry
                    carry = t
                    s += 1

    cdef int64_t dense_costs(self, int64_t i) noexcept nogil:
        """:meth:`costs` of sample ``i`` as ``extra[w]`` = -``D[w]``, one entry per worker; returns the total."""
        cdef int64_t total = self.costs(i, -1, &self.saving[0]), w, s, bit
        for w in range(self.n_workers):
            bit = w + 1
            self.extra[w] = 0
            for s in range(self.n_slices):
                self.extra[w] -= ((self.saving[s * self.words + (bit >> 6)] >> (bit & 63)) & 1) << s
        return total

    cdef void move(self, int64_t i, int64_t w, int sign, bint every_row=False) noexcept nogil:
        """Place (``sign`` 1) or take back (-1, counting pairs only) sample ``i`` on worker ``w``.

        Only its rows that are not common unless ``every_row``: no cost
        counts a common row's trainers, but the holders after the batch do
        (:meth:`holders_after`, the look-ahead).
        """
        cdef int64_t k, u, h
        cdef int64_t word = (w + 1) >> 6
        cdef uint64_t bit = (<uint64_t>1) << ((w + 1) & 63)
        cdef bint changed
        for k in range(self.n_tables if every_row else self.live[i]):
            u = self.ids[i * self.n_tables + k]
            if self.counts_pairs:
                h = probe(self.pair_keys, self.pair_mask, u * self.n_workers + w)
                if self.pair_keys[h] == -1:
                    self.pair_keys[h] = u * self.n_workers + w
                    self.pair_used += 1
                self.pair_count[h] += sign
                changed = (sign > 0 and self.pair_count[h] == 1) or (sign < 0 and self.pair_count[h] == 0)
            else:  # placing only: the row's trainer bit says whether w already trains it
                changed = not (self.trains(u)[word] & bit)
            if changed:
                self.trains(u)[word] ^= bit
                if not (self.fresh(u)[word] & bit):
                    self.fields(u)[N_MISS] += sign

    cdef void block_move(self, int64_t i, int64_t w, Delta* delta) noexcept nogil:
        """Place sample ``i`` on worker ``w`` in a block's ``delta`` only (:func:`place_blocks`): the records,
        which the other blocks read meanwhile, stay as the round found them. Right after :meth:`costs` of
        ``i``, whose entries it starts from: a free one there is still the first free one on its row's
        probe path unless this sample's earlier rows took it."""
        cdef int64_t k, u, d
        cdef int64_t word = (w + 1) >> 6
        cdef uint64_t bit = (<uint64_t>1) << ((w + 1) & 63)
        cdef uint64_t* entry
        for k in range(self.live[i]):
            u = self.ids[i * self.n_tables + k]
            d = delta.slots[k]
            if delta_taken(delta, d) and not delta_has(delta, d, u):
                d = delta_slot(delta, d, u)
            entry = &delta.entries[d * delta.stride]
            if not delta_has(delta, d, u):
                memset(entry, 0, delta.stride * sizeof(uint64_t))
                entry[KEY] = <uint64_t>((delta.round << 32) | u)
            if not ((self.trains(u)[word] | entry[BITS + word]) & bit):
                entry[BITS + word] |= bit
                if not (self.fresh(u)[word] & bit):
                    entry[MISS] += 1

    cdef inline void merge_row(self, int64_t u, int64_t w) noexcept nogil:
        """Row ``u`` trained on worker ``w`` by a sample kept at a round's end, into its record
        (:func:`place_blocks`: one thread writes each row's record, so the writes are plain)."""
        cdef int64_t word = (w + 1) >> 6
        cdef uint64_t bit = (<uint64_t>1) << ((w + 1) & 63)
        if self.trains(u)[word] & bit:
            return
        self.trains(u)[word] |= bit
        if not (self.fresh(u)[word] & bit):
            self.fields(u)[N_MISS] += 1

    cdef bint can_move(self) noexcept nogil:
        """Whether a swap (two samples, both ways) still fits the (row, worker) table below 3/4 full.

        Entries whose count went back to 0 stay (linear probing keeps no
        tombstones), so every trial move may add keys: the swap pass stops
        when the next one could fill the table.
        """
        return self.counts_pairs and self.pair_used + 4 * self.n_tables <= 3 * (self.pair_mask + 1) // 4

    cdef int64_t row_cost(self, int64_t u) noexcept nogil:
        """This batch's reads of row ``u`` (pulls and the owner's plan push; full set: its pushes too)."""
        cdef int64_t word, trainers = 0
        cdef int32_t* f = self.fields(u)
        if self.seen[u] >= self.common:
            return 0
        if self.full_set:
            for word in range(self.words):
                trainers += popcount64(self.trains(u)[word])
        return f[N_MISS] + (1 if f[OWNER] >= 0 and f[N_MISS] > 0 else 0) + trainers

    cdef int64_t pair_cost(self, int64_t i, int64_t j) noexcept nogil:
        """The summed cost of the distinct rows of samples ``i`` and ``j`` (each row once)."""
        cdef int64_t k, u, total = 0, s
        self.stamp += 1
        for s in range(2):
            for k in range(self.n_tables):
                u = self.ids[(i if s == 0 else j) * self.n_tables + k]
                if self.visited[u] != self.stamp:
                    self.visited[u] = <int32_t>self.stamp
                    total += self.row_cost(u)
        return total

    cdef int64_t leave_saving(self, int64_t i, int64_t w) noexcept nogil:
        """About what taking sample ``i`` off worker ``w`` saves: its rows no other sample there uses."""
        cdef int64_t k, u, h, saving = 0
        for k in range(self.n_tables):
            u = self.ids[i * self.n_tables + k]
            if self.seen[u] >= self.common:
                continue
            h = probe(self.pair_keys, self.pair_mask, u * self.n_workers + w)
            if self.pair_count[h] == 1:
                saving += self.full_set + (0 if (self.fresh(u)[(w + 1) >> 6] >> ((w + 1) & 63)) & 1 else 1)
        return saving


def allocate_cost(*, const uint64_t[::1] holders, int words, int n_workers, const int64_t[:, ::1] rows,
                  const int32_t[::1] tables, const int64_t[::1] capacity, uint64_t seed, uint64_t iteration,
                  order=None, bint confident=False, bint full_set=False, int swap_rounds=0, int threads=1,
                  CostScratch scratch=None, BatchCosts board=None, BatchCosts beside=None, int blocks=1,
                  int block_size=32):
    """Each sample to the worker where it adds the fewest transmissions, given the samples placed before it.

    The cost of placing a sample on worker ``w`` sums over its rows (in
    ``tables``) what that adds to the iteration's reads (docs/design.md
    section 4): nothing if ``w`` holds the row fresh or already trains it in
    this batch; otherwise a pull, plus the holder's plan push when the only
    latest copy is on another worker and no trainer has asked for it yet.
    With ``full_set`` (mode laia) every new trainer also pushes the row.

    Two choices were measured (the design's table): a row in ``COMMON *
    n_workers`` or more of the batch's samples counts for no worker, since
    every worker trains it whatever the allocation (counting it fills the
    first workers with samples that share only such rows); and the
    Accumulates of rows trained by several workers are not charged (charging
    them cut fewer transmissions on both real and synthetic data).
    Among the cheapest workers the one with the least cost placed on it so
    far wins (the busiest worker sets an iteration's pace); remaining ties
    are broken as in Algorithm 1, by a hash of (seed, iteration, sample).
    Samples are taken in ``order`` (a permutation), or with ``confident``
    by their :func:`fresh_margins`, largest first (:func:`margin_order`), read from the batch's
    row records; else as they come. Then up to ``swap_rounds`` rounds of :func:`swap_pass`. ``threads``
    find the batch's distinct rows; samples are placed one after another,
    so the result does not depend on them. ``scratch`` (a :class:`CostScratch`): memory to reuse from
    the last call. Returns int32 worker per sample.

    ``board``: this batch's :class:`BatchCosts`, made earlier without holders
    (it owns its scratch; ``scratch`` is then unused). ``beside``: the next
    batch's, made without holders: with two threads or more, one of them
    finds its distinct rows while another places this batch (the placement
    is serial; the next batch's rows do not depend on it), so that the
    next call only binds it to the holders (docs/design.md section 3, "Threads").

    ``blocks`` above 1 places the samples in rounds of that many concurrent
    blocks of ``block_size`` samples each (:func:`place_blocks`), on
    ``threads``: the result depends on the two, never on the threads. It
    cannot be refined by swaps (their pair counts follow one placement after another).
    """
    cdef Py_ssize_t n_samples = rows.shape[0], k
    check_scoring(words, n_workers, rows.shape[1], tables)
    if blocks < 1 or block_size < 1:
        raise ValueError(f"blocks ({blocks}) and block_size ({block_size}) must be at least 1")
    if blocks > 1 and swap_rounds:
        raise ValueError("the swap pass follows one placement after another: it needs blocks=1")
    if confident and order is not None:
        raise ValueError("give an order or confident=True, not both")
    cdef int64_t[::1] steps = checked_order(capacity, n_samples, n_workers, order)
    cdef int pair_room = SWAP_ROOM if swap_rounds else 2
    if beside is not None:
        if beside is board or beside.shaped or beside.scratch is (scratch if board is None else board.scratch):
            raise ValueError("beside: the next batch's board, not yet shaped, with a scratch of its own")
        beside.check_settings(words, n_workers, full_set, pair_room)
    if board is None:
        board = BatchCosts(holders, words, n_workers, rows, tables, full_set, pair_room=pair_room, threads=threads,
                           scratch=scratch)
    else:
        board.check_made_for(rows, tables, words, n_workers, full_set, pair_room)
        if not board.shaped:
            board.shape(threads)
        board.bind(holders, None, threads)
    if confident:
        steps = margin_order(board.margins(threads))
    cdef const int64_t* taken = &steps[0] if steps.shape[0] else NULL
    alloc = np.empty(n_samples, dtype=np.int32)
    greedy(board, alloc, capacity, seed, iteration, taken, beside if threads >= 2 else None, blocks, block_size,
           threads)
    if beside is not None and not beside.shaped:
        beside.shape(threads)
    for k in range(swap_rounds):
        if not swap_pass(board, alloc):
            break
    return alloc


def next_board(*, int words, int n_workers, const int64_t[:, ::1] rows, const int32_t[::1] tables,
               bint full_set=False, int swap_rounds=0, int threads=1, CostScratch scratch=None):
    """The :class:`BatchCosts` of the batch after the one about to be allocated, made without holders: give it
    to that :func:`allocate_cost` as ``beside``, then to the next as ``board`` (same settings; the two
    boards on two scratches)."""
    return BatchCosts(None, words, n_workers, rows, tables, full_set, pair_room=SWAP_ROOM if swap_rounds else 2,
                      threads=threads, scratch=scratch)


cdef void greedy(BatchCosts board, int32_t[::1] out, const int64_t[::1] capacity, uint64_t seed,
                 uint64_t iteration, const int64_t* taken, BatchCosts beside=None, int blocks=1, int block_size=1,
                 int threads=1) except *:
    """Each sample, in ``taken`` order (NULL: as they come), to its cheapest worker with room; see allocate_cost.

    With ``beside``, a second thread shapes that board meanwhile (in
    reserved tables; if they fill, it is left for the caller to shape).
    With ``blocks`` above 1, :func:`place_blocks` on ``threads`` instead (``beside`` is then left to the caller).
    """
    if blocks > 1:
        place_blocks(board, out, capacity, seed, iteration, taken, blocks, block_size, threads)
        return
    cdef int64_t n_workers = board.n_workers, words = board.words
    cdef int64_t[::1] remaining = np.array(capacity, dtype=np.int64)
    cdef int64_t[::1] load = np.zeros(n_workers, dtype=np.int64)
    cdef uint64_t[::1] room = np.zeros(words, dtype=np.uint64)  # workers with room, in the holders' bit layout
    cdef uint64_t[::1] best = np.zeros(words, dtype=np.uint64)
    cdef int64_t w
    for w in range(n_workers):
        if remaining[w] > 0:
            room[(w + 1) >> 6] |= (<uint64_t>1) << ((w + 1) & 63)
    if beside is None:
        with nogil:
            place(board, out, &remaining[0], &load[0], &room[0], &best[0], seed, iteration, taken)
        return
    beside.reserve(beside.first_size())
    with nogil, parallel(num_threads=2):
        if threadid() == 0:
            place(board, out, &remaining[0], &load[0], &room[0], &best[0], seed, iteration, taken)
        else:
            beside.shaped_beside = beside.shape_pass(1)
    if beside.shaped_beside:
        beside.finish_shape()


cdef void place(BatchCosts board, int32_t[::1] out, int64_t* remaining, int64_t* load, uint64_t* room,
                uint64_t* best, uint64_t seed, uint64_t iteration, const int64_t* taken) noexcept nogil:
    """The greedy placement itself (see :func:`greedy`): one sample after another."""
    cdef int64_t n_samples = out.shape[0]
    cdef uint64_t* saving = &board.saving[0]
    cdef int64_t i, j, w, added
    for j in range(n_samples):
        i = taken[j] if taken != NULL else j
        if j + 2 < n_samples:
            board.prefetch_ids(taken[j + 2] if taken != NULL else j + 2)
        w = take_cheapest(board, i, -1 if j + 1 == n_samples else (taken[j + 1] if taken != NULL else j + 1),
                          saving, NULL, remaining, load, room, best, seed, iteration, &added)
        out[i] = <int32_t>w
        board.move(i, w, 1)


cdef inline int64_t lines(int64_t words) noexcept nogil:
    """``words`` 8-byte words rounded up to whole 64-byte lines, plus one line (a row may start mid-line)."""
    return (words + 7) // 8 * 8 + 8


cdef void place_blocks(BatchCosts board, int32_t[::1] out, const int64_t[::1] capacity, uint64_t seed,
                       uint64_t iteration, const int64_t* taken, int blocks, int block_size, int threads) except *:
    """The greedy placement in rounds of ``blocks`` concurrent blocks of ``block_size`` samples (docs/design.md
    section 4, "Blocks").

    A round takes the next ``blocks * block_size`` samples of the order and
    cuts them into ``blocks`` contiguous blocks. Each block places its
    samples greedily against the records as the round found them plus its
    own placements (its :class:`Delta`), with the capacity and load the round
    found less and plus its own. At the round's end, each worker keeps the
    placements the capacity left it in position order; the others start the
    next round, before the order's next samples (the round's first sample is
    always kept, so every round makes progress). The kept samples then
    enter the records, each thread writing its own share of rows. Nothing a block reads depends on another block of its
    round, so the result depends on ``blocks`` and ``block_size``, never on
    ``threads``; one block is the serial placement, round by round.
    """
    cdef int64_t n_samples = out.shape[0], n_workers = board.n_workers, words = board.words
    cdef int64_t per_round = <int64_t>blocks * block_size, delta_size = 16, w, p, pos = 0, n_round, n_pending = 0
    cdef int64_t most_live = 1
    cdef int b
    for p in range(n_samples):
        most_live = max(most_live, board.live[p])
    while delta_size < 2 * block_size * most_live:  # a block's rows in a round, at most half its table
        delta_size <<= 1
    cdef CostScratch kept = board.scratch
    cdef int64_t[::1] remaining = np.array(capacity, dtype=np.int64)
    cdef int64_t[::1] load = np.zeros(n_workers, dtype=np.int64)
    cdef uint64_t[::1] room = np.zeros(words, dtype=np.uint64)
    # a block's working memory is the thread's that places it (a thread places its blocks one after another),
    # each thread's row padded to whole cache lines: two threads writing one line cost 6x on two threads (measured)
    cdef int lanes = max(1, min(threads, blocks)), t
    cdef int64_t[:, ::1] block_remaining = kept.kept("remaining", (lanes, lines(n_workers)), np.int64, 0)
    cdef int64_t[:, ::1] block_load = kept.kept("load", (lanes, lines(n_workers)), np.int64, 0)
    cdef uint64_t[:, ::1] block_room = kept.kept("room", (lanes, lines(words)), np.uint64, 0)
    cdef uint64_t[:, ::1] block_best = kept.kept("best", (lanes, lines(words)), np.uint64, 0)
    cdef uint64_t[:, ::1] block_saving = kept.kept("saving", (lanes, lines(board.n_slices * words)), np.uint64, 0)
    cdef uint64_t[:, ::1] entries = kept.kept("entries", (lanes, lines(delta_size * (BITS + words))), np.uint64, 0)
    cdef int64_t[:, ::1] slots = kept.kept("slots", (lanes, lines(max(1, board.n_tables))), np.int64, 0)
    cdef int64_t[:, ::1] raw = kept.kept("raw", (lanes, lines(block_size * most_live)), np.int64, 0)
    cdef int64_t[:, ::1] pairs = kept.kept("pairs", (blocks, lines(block_size * most_live)), np.int64, 0)
    cdef int64_t[:, ::1] starts = kept.kept("starts", (blocks, lines(lanes + 1)), np.int64, 0)
    cdef int64_t[::1] now = kept.kept("now", (per_round,), np.int64, 0)          # the round's samples, by position
    cdef int64_t[::1] pending = kept.kept("pending", (per_round,), np.int64, 0)  # the last round's not kept
    cdef int64_t[::1] added = kept.kept("added", (per_round,), np.int64, 0)      # what each adds to its worker's load
    cdef int32_t[::1] choice = kept.kept("choice", (per_round,), np.int32, 0)
    cdef int8_t[::1] taken_now = kept.kept("kept", (per_round,), np.int8, 0)
    cdef Delta* deltas = <Delta*>malloc(lanes * sizeof(Delta))
    if deltas == NULL:
        raise MemoryError()
    memset(&entries[0, 0], 0xFF, entries.shape[0] * entries.shape[1] * sizeof(uint64_t))  # round -1: all free
    for t in range(lanes):  # (clearing the tables brings them into the caches: it is cheaper than not)
        deltas[t].entries, deltas[t].slots, deltas[t].stride = &entries[t, 0], &slots[t, 0], BITS + words
        deltas[t].mask, deltas[t].round = delta_size - 1, -1
    for w in range(n_workers):
        if remaining[w] > 0:
            room[(w + 1) >> 6] |= (<uint64_t>1) << ((w + 1) & 63)
    try:
        with nogil:
            while pos < n_samples or n_pending > 0:
                for p in range(n_pending):
                    now[p] = pending[p]
                n_round = n_pending
                while n_round < per_round and pos < n_samples:
                    now[n_round] = taken[pos] if taken != NULL else pos
                    n_round += 1
                    pos += 1
                for b in prange(blocks, num_threads=lanes, schedule="static", chunksize=1):
                    t = threadid()
                    place_block(board, b, blocks, &now[0], n_round, &remaining[0], &load[0], &room[0],
                                &block_remaining[t, 0], &block_load[t, 0], &block_room[t, 0], &block_best[t, 0],
                                &block_saving[t, 0], &deltas[t], &choice[0], &added[0], seed, iteration,
                                &raw[t, 0], &pairs[b, 0], &starts[b, 0], lanes)
                n_pending = 0
                for b in range(blocks):  # each worker keeps what its capacity allows, in position order
                    for p in range(min(n_round, b * n_round // blocks), min(n_round, (b + 1) * n_round // blocks)):
                        w = choice[p]
                        taken_now[p] = remaining[w] > 0
                        if taken_now[p]:
                            out[now[p]] = <int32_t>w
                            take(w, added[p], &remaining[0], &load[0], &room[0])
                        else:
                            pending[n_pending] = now[p]
                            n_pending += 1
                for t in prange(lanes, num_threads=lanes, schedule="static", chunksize=1):
                    merge_rows(board, t, blocks, &pairs[0, 0], pairs.shape[1], &starts[0, 0], starts.shape[1],
                               &taken_now[0], &choice[0])
    finally:
        free(deltas)


cdef inline int lane_of(int64_t u, int lanes) noexcept nogil:
    """The thread that writes row ``u``'s record after a round: rows dealt round-robin. Rows are numbered
    as the batch first uses them, so its frequent rows come first: contiguous ranges gave the first
    thread most of the pairs to merge. A record is a line of its own, so neighbours on two threads share none."""
    return <int>(u % lanes)


cdef void merge_rows(BatchCosts board, int t, int blocks, const int64_t* pairs, int64_t pair_stride,
                     const int64_t* starts, int64_t start_stride, const int8_t* kept,
                     const int32_t* choice) noexcept nogil:
    """The round's kept (row, sample) pairs of lane ``t``'s rows, from every block, into the records."""
    cdef int64_t q, pair
    cdef int b
    for b in range(blocks):
        for q in range(starts[b * start_stride + t], starts[b * start_stride + t + 1]):
            pair = pairs[b * pair_stride + q]
            if kept[pair & LOW32]:
                board.merge_row(pair >> 32, choice[pair & LOW32])


cdef void place_block(BatchCosts board, int b, int blocks, const int64_t* now, int64_t n_round,
                      const int64_t* remaining, const int64_t* load, const uint64_t* room, int64_t* my_remaining,
                      int64_t* my_load, uint64_t* my_room, uint64_t* best, uint64_t* saving, Delta* delta,
                      int32_t* choice, int64_t* added, uint64_t seed, uint64_t iteration, int64_t* raw,
                      int64_t* pairs, int64_t* starts, int lanes) noexcept nogil:
    """Block ``b``'s samples of the round (its contiguous share of the positions): see :func:`place_blocks`.

    Then its (row, position) pairs, in ``pairs`` by the lane that merges
    the row (``starts[t]`` to ``starts[t + 1]``), so that no record is
    written by two threads: atomic writes to the records every thread has
    just read took 4x the CPU time on two threads of plain ones on one (measured).
    """
    cdef int64_t n_workers = board.n_workers, words = board.words, p, i, w, k, n_pairs = 0
    cdef int t
    memcpy(my_remaining, remaining, n_workers * sizeof(int64_t))
    memcpy(my_load, load, n_workers * sizeof(int64_t))
    memcpy(my_room, room, words * sizeof(uint64_t))
    delta.round += 1
    cdef int64_t first = min(n_round, b * n_round // blocks), last = min(n_round, (b + 1) * n_round // blocks)
    p = first
    while p < last:
        i = now[p]
        if p + 2 < last:
            board.prefetch_ids(now[p + 2])
        w = take_cheapest(board, i, now[p + 1] if p + 1 < last else -1, saving, delta, my_remaining, my_load,
                          my_room, best, seed, iteration, &added[p])
        choice[p] = <int32_t>w
        board.block_move(i, w, delta)
        for k in range(board.live[i]):
            raw[n_pairs] = (<int64_t>board.ids[i * board.n_tables + k] << 32) | p
            n_pairs += 1
        p += 1
    for t in range(lanes + 1):  # a counting sort by lane: starts[t + 1] counts, then ends, then starts[t] starts
        starts[t] = 0
    for k in range(n_pairs):
        starts[lane_of(raw[k] >> 32, lanes) + 1] += 1
    for t in range(lanes):
        starts[t + 1] += starts[t]
    for k in range(n_pairs):
        t = lane_of(raw[k] >> 32, lanes)
        pairs[starts[t]] = raw[k]
        starts[t] += 1
    for t in range(lanes, 0, -1):
        starts[t] = starts[t - 1]
    starts[0] = 0


cdef inline int64_t take_cheapest(BatchCosts board, int64_t i, int64_t next_i, uint64_t* saving,
                                  const Delta* delta, int64_t* remaining, int64_t* load, uint64_t* room,
                                  uint64_t* best, uint64_t seed, uint64_t iteration, int64_t* added) noexcept nogil:
    """Sample ``i``'s cheapest worker with room (ties: the least loaded, then the hash), which it then takes: a
    slot of ``remaining`` (``room`` loses the worker when none is left) and what it adds to ``load`` (also into
    ``added``). The one step of :func:`place` and of a block's (:func:`place_block`, with its ``delta``)."""
    cdef int64_t total = board.costs(i, next_i, saving, delta)
    cdef int64_t saved = cheapest(saving, board.n_slices, board.words, room, best)
    cdef int64_t w = least_loaded(best, board.words, load, seed, iteration, i)
    added[0] = total - saved
    take(w, added[0], remaining, load, room)
    return w


cdef inline void take(int64_t w, int64_t added, int64_t* remaining, int64_t* load, uint64_t* room) noexcept nogil:
    """Worker ``w`` takes a sample that adds ``added`` to its load: a slot of ``remaining``, and out of
    ``room`` once none is left."""
    remaining[w] -= 1
    if remaining[w] == 0:
        room[(w + 1) >> 6] &= ~((<uint64_t>1) << ((w + 1) & 63))
    load[w] += added


cdef int64_t cheapest(const uint64_t* saving, int64_t n_slices, int64_t words, const uint64_t* room,
                      uint64_t* best) noexcept nogil:
    """The workers with room whose saving ``D`` is largest, into ``best`` (bits); returns that saving.

    From the top slice down, keep the candidates whose bit is set if any is:
    what is left has the largest ``D``, bit by bit.
    """
    cdef int64_t s, k, saved = 0
    cdef uint64_t any_set
    for k in range(words):
        best[k] = room[k]
    for s in range(n_slices - 1, -1, -1):
        any_set = 0
        for k in range(words):
            any_set |= best[k] & saving[s * words + k]
        if any_set:
            saved |= (<int64_t>1) << s
            for k in range(words):
                best[k] &= saving[s * words + k]
    return saved


cdef int64_t least_loaded(const uint64_t* candidates, int64_t words, const int64_t* load, uint64_t seed,
                          uint64_t iteration, int64_t i) noexcept nogil:
    """Among ``candidates`` (bits), the one with the least cost placed on it; ties by a hash of the sample."""
    cdef int64_t k, w, least = -1, ties = 0, pick
    cdef uint64_t x
    cdef uint64_t stream = iteration * <uint64_t>0x100000001B3ULL + TIE_STREAM
    for k in range(words):
        x = candidates[k]
        while x:
            w = 64 * k + ctz64(x) - 1
            if least < 0 or load[w] < least:
                least = load[w]
                ties = 1
            elif load[w] == least:
                ties += 1
            x &= x - 1
    pick = <int64_t>(hash3(seed, stream, <uint64_t>i) % <uint64_t>ties)
    for k in range(words):
        x = candidates[k]
        while x:
            w = 64 * k + ctz64(x) - 1
            if load[w] == least:
                if pick == 0:
                    return w
                pick -= 1
            x &= x - 1
    return -1


def lookahead_cost(*, const uint64_t[::1] holders, int words, int n_workers, const int64_t[:, ::1] rows,
                   const int32_t[::1] alloc, const int64_t[:, ::1] rows_next, const int32_t[::1] tables,
                   const int64_t[::1] capacity_next, uint64_t seed, uint64_t iteration_next, bint full_set=False,
                   CostScratch scratch=None, CostScratch scratch_next=None):
    """The reads of batch ``rows`` placed as ``alloc``, plus those of the next batch's greedy allocation
    (arrival order) from the holders that placement leaves (the multi-batch look-ahead). The two
    scratches (memory to reuse, see :func:`allocate_cost`) must differ."""
    if scratch is not None and scratch is scratch_next:
        raise ValueError("lookahead_cost scores two batches at once: give it two scratches")
    if alloc.shape[0] != rows.shape[0]:
        raise ValueError(f"alloc: expected {rows.shape[0]} samples, got {alloc.shape[0]}")
    if rows_next.shape[1] != rows.shape[1]:
        raise ValueError(f"rows_next has {rows_next.shape[1]} tables, rows {rows.shape[1]}")
    if capacity_next.shape[0] != n_workers or np.asarray(capacity_next).sum() != rows_next.shape[0]:
        raise ValueError(f"capacity_next must give {n_workers} workers room for {rows_next.shape[0]} samples")
    cdef BatchCosts now = BatchCosts(holders, words, n_workers, rows, tables, full_set, scratch=scratch)
    cdef int64_t i
    for i in range(rows.shape[0]):
        if alloc[i] < 0 or alloc[i] >= n_workers:
            raise ValueError(f"alloc[{i}] = {alloc[i]} is not a worker in [0, {n_workers})")
        now.move(i, alloc[i], 1, True)
    cdef BatchCosts after = BatchCosts(holders, words, n_workers, rows_next, tables, full_set, previous=now,
                                       scratch=scratch_next)
    greedy(after, np.empty(rows_next.shape[0], dtype=np.int32), capacity_next, seed, iteration_next, NULL)
    return now.batch_cost() + after.batch_cost()


cdef int64_t swap_pass(BatchCosts board, int32_t[::1] alloc):
    """One round of exchanges: samples that would rather be on each other's worker swap when that costs less.

    Each sample's best other worker is estimated (what leaving saves minus
    what joining adds); samples wanting a -> b, largest estimated gains
    first, try up to ``SWAP_TRIES`` of the samples wanting b -> a, and a pair
    swaps only if the exact cost of their rows falls. Capacities never change, and the result
    depends on the batch and the state only. Returns the swaps made.
    """
    cdef int64_t n_samples = alloc.shape[0], n_workers = board.n_workers
    gain_array = np.zeros(n_samples, dtype=np.int64)
    target_array = np.full(n_samples, -1, dtype=np.int64)
    cdef int64_t[::1] gain = gain_array, target = target_array
    cdef int64_t i, j, w, a, b, total, saving, g, before, swaps = 0
    with nogil:
        for i in range(n_samples):
            a = alloc[i]
            total = board.dense_costs(i)
            saving = board.leave_saving(i, a)
            for w in range(n_workers):
                g = saving - (total + board.extra[w])
                if w != a and g > gain[i]:
                    gain[i] = g
                    target[i] = w
    wanting = np.flatnonzero(target_array >= 0)
    if len(wanting) < 2:
        return 0
    alloc_array = np.asarray(alloc).astype(np.int64)
    route = alloc_array[wanting] * n_workers + target_array[wanting]  # a * n + b
    by_route = wanting[np.lexsort((wanting, -gain_array[wanting], route))]
    routes = alloc_array[by_route] * n_workers + target_array[by_route]
    first_array = np.searchsorted(routes, np.arange(n_workers * n_workers + 1)).astype(np.int64)
    order_array = wanting[np.lexsort((wanting, -gain_array[wanting]))]
    cdef int64_t[::1] queue = by_route, first = first_array, next_at = first_array[:n_workers * n_workers].copy()
    cdef int64_t[::1] order = order_array
    used_array = np.zeros(n_samples, dtype=np.int8)
    cdef int8_t[::1] used = used_array
    cdef int64_t k, p, tries
    with nogil:
        for k in range(order.shape[0]):
            i = order[k]
            if used[i]:
                continue
            a = alloc[i]
            b = target[i]
            if a == b:
                continue
            while next_at[b * n_workers + a] < first[b * n_workers + a + 1] and \
                    used[queue[next_at[b * n_workers + a]]]:  # swapped already: skip it for good
                next_at[b * n_workers + a] += 1
            tries = 0
            p = next_at[b * n_workers + a]
            while p < first[b * n_workers + a + 1] and tries < SWAP_TRIES and board.can_move():
                j = queue[p]
                p += 1
                if used[j]:
                    continue
                tries += 1
                before = board.pair_cost(i, j)
                board.move(i, a, -1)
                board.move(i, b, 1)
                board.move(j, b, -1)
                board.move(j, a, 1)
                if board.pair_cost(i, j) < before:
                    alloc[i] = <int32_t>b
                    alloc[j] = <int32_t>a
                    used[i] = used[j] = 1
                    swaps += 1
                    break
                board.move(j, a, -1)
                board.move(j, b, 1)
                board.move(i, b, -1)
                board.move(i, a, 1)
    return swaps
