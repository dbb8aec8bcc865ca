# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The cluster state: one source of truth for the scheduler, the caches and the simulator.

docs/design.md, section 3. For every embedding row ``e``
the state keeps ``L(e)``, the set of holders of its latest value (bit 0 = PS,
bit ``w + 1`` = worker ``w``), and for every worker a cache of ``capacity``
slots with LRU (or LFU) replacement and a row -> slot map. It depends only on
allocations, never on gradient values, so every rank steps its own copy
forward identically.

One iteration ``t`` is three calls:

1. ``set_needs(rows_t, alloc_t)`` (done by the previous ``plan`` or by the
   first call): which worker needs which row;
2. ``train()``: pull (with dirty write-backs on eviction) and update (local
   SGD for rows trained by one worker, Accumulate for shared rows; in
   full-set mode every trained row is pushed);
3. ``plan(rows_t1, alloc_t1)``: sets the needs of ``t + 1`` and, in
   on-demand mode, pushes the dirty rows another worker needs in ``t + 1``
   (Herald's Algorithm 2).

With ``staleness >= 0`` (HET, docs/design.md section 7) the holder sets are
not used: rows are read and pushed by per-row versions and per-slot clocks
(``pull_worker_het``, ``update_het``).

A worker reads only its own events of each call, by kind (``worker_events``):
per-iteration work follows the batch. With ``annotate`` (where a worker runs
the scheduler) each call's events are also hashed (the cross-rank digest),
and a pull is marked *prefetchable* when the previous iteration wrote
nothing to that row at the PS (no Accumulate, Put or write-back): its value
is final before the previous iteration ends, so the runtime may read it
while that iteration computes. For one *focus* worker (the runtime's own)
``set_needs`` also builds the per-sample index of its unique rows
(``focus_needs``).

Threads (``threads``, docs/design.md section 3): every call runs across
them, and its events, state and digest are those of one thread. Workers'
needs, pulls and updates run one worker per thread, each writing its own
cache, its own events (a region per worker) and, evicting a row, its own
holder bit of it (atomically: other workers' bits share the word); rows'
holders after the update and the plan's pushes run by row. The insert-only
needs table takes entries by compare-and-swap, so where a row lands in it
depends on timing, never whether it is there.

Memory, per rank: 8 bytes per embedding row per 64 holders (the holder bits),
14 bytes per cache slot of every worker (4 row + 4 replacement links of 16
bits, 8 where a worker has 65,536 slots or more, + 6 for the row -> slot
table of 4-byte entries at load <= 2/3; LFU adds 4), and scratch that
follows the global batch (the event records and the pairs: about 76 bytes
per (worker, row) pair of a batch; the needs table and its records follow
the distinct rows a batch needs), and two bitmaps of the rows written to the
PS (1/4 byte per row, 1/8 more for the lists of their words in use).
Nothing per iteration touches an array of table or cache size.
"""
import hashlib
import time

cimport cython
import numpy as np
from cython.parallel cimport prange, threadid
from libc.stdint cimport INT64_MAX, int8_t, int16_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memset

from atomics cimport and_u64_if, cas_i64_if, fetch_add_i64, fetch_or_u64, load_i64, or_u64_if, store_i64
from counter_hash cimport chain64, fold4, mix64

cdef extern from *:
    int popcount64 "__builtin_popcountll"(unsigned long long) nogil
    int ctz64 "__builtin_ctzll"(unsigned long long) nogil
    void prefetch "__builtin_prefetch"(const void*) nogil

# Rows are touched in random order, so the loops below are bound by memory
# latency; they prefetch the row a few steps ahead to overlap the misses.
# A loop that does little more than one lookup per step prefetches further
# (FAR_AHEAD) to keep as many misses in flight.
cdef enum:
    AHEAD = 8
    FAR_AHEAD = 32
    LFU_BUCKETS = 256
    NEED_BLOCK = 64  # need indices a thread takes at once: threads share no counter and few cache lines
    MIN_NEED_BITS = 14  # the smallest needs table: 16384 entries
    DIGEST_SPAN = 8192  # events hashed as one task of digest_events
    LINE = 16  # int32 per 64-byte cache line: each worker's replacement heads and fill counts start a line

# Event kinds recorded by train() and plan(); the runtime executes them, the
# simulator counts them (docs/design.md section 6).
PULL, WRITEBACK, LOCAL, ACCUMULATE, FULL_SET_PUSH, PLAN_PUSH, P2P, VERSION_CHECK, DELTA_PUSH, DELTA_WRITEBACK \
    = range(10)
KIND_NAMES = ("pull", "writeback", "local", "accumulate", "full_set_push", "plan_push", "p2p",
              "version_check", "delta_push", "delta_writeback")
# What counts (docs/design.md section 6): rows read from the PS, rows written to it, rows sent
# worker to worker; one update event per trained (worker, row) pair; HET's version reads apart.
PULL_KINDS = ("pull",)
PUSH_KINDS = ("writeback", "accumulate", "full_set_push", "plan_push", "delta_push", "delta_writeback")
PEER_KINDS = ("p2p",)
UPDATE_KINDS = ("local", "accumulate", "full_set_push", "delta_push")
CHECK_KINDS = ("version_check",)
cdef enum:
    PS_BIT = 0          # holder bit of the parameter server; worker w is bit w + 1
    EMPTY = -1
    N_KINDS = 10

cdef enum:
    K_PULL = 0
    K_WRITEBACK = 1
    K_LOCAL = 2
    K_ACCUMULATE = 3
    K_FULL_SET_PUSH = 4
    K_PLAN_PUSH = 5
    K_P2P = 6
    K_VERSION_CHECK = 7
    K_DELTA_PUSH = 8
    K_DELTA_WRITEBACK = 9


class StateError(RuntimeError):
    """The state machine reached a state docs/design.md section 3 rules out."""


cdef int64_t LOW32 = (<int64_t>1 << 32) - 1
cdef uint32_t TABLE_EMPTY = 0xFFFFFFFF
cdef uint16_t NARROW_EMPTY = 0xFFFF
cdef uint64_t GOLDEN = 0x9E3779B97F4A7C15ULL


cdef inline uint64_t row_hash(int64_t row) noexcept nogil:
    cdef uint64_t x = <uint64_t>row * GOLDEN
    return x ^ (x >> 29)


cdef inline int64_t fib_home(int64_t row, int shift) noexcept nogil:
    """Home of ``row`` in a power-of-two table of ``2 ** (64 - shift)`` entries (Fibonacci hashing)."""
    return <int64_t>((<uint64_t>row * GOLDEN) >> shift)


def saved_written_rows(arrays, int64_t iteration, int64_t n_rows):
    """The rows a saved state's iteration ``iteration`` wrote to the PS, checked.

    States saved before the bitmaps kept two hash tables ("written") of
    ``stamp << 32 | row`` entries, iteration t's in table t & 1 with stamp
    (t + 2) << 32; they still load.
    """
    if "written_rows" in arrays:
        rows = np.asarray(arrays["written_rows"])
        if rows.ndim != 1 or rows.dtype != np.int64 or ((rows < 0) | (rows >= n_rows)).any():
            raise ValueError(f"saved cluster state's written rows must be int64 rows in [0, {n_rows})")
        return np.ascontiguousarray(rows)
    tables = np.asarray(arrays["written"])
    half = len(tables) // 2
    if tables.ndim != 1 or tables.dtype != np.int64 or half < 16 or half & (half - 1) or len(tables) != 2 * half:
        raise ValueError(f"saved cluster state's written-row tables are {tables.shape} {tables.dtype}: "
                         f"expected two tables of a power of two (>= 16) int64 entries")
    current = tables[(iteration & 1) * half:((iteration & 1) + 1) * half]
    rows = current[(current >> 32) == ((iteration + 2) & LOW32)] & LOW32
    if ((rows >= n_rows)).any():
        raise ValueError(f"saved cluster state's written-row tables name rows outside [0, {n_rows})")
    return np.sort(rows).astype(np.int64)


cdef inline bint transmits(int kind) noexcept nogil:
    """Whether an event of ``kind`` moves a row (docs/design.md section 6): all but local updates and
    HET's version reads."""
    return kind != K_LOCAL and kind != K_VERSION_CHECK


cdef int table_bits(int64_t entries):
    """log2 of the smallest power of two >= ``entries`` (at least 16 entries)."""
    cdef int bits = 4
    while (<int64_t>1 << bits) < entries:
        bits += 1
    return bits


@cython.final  # cdef methods called directly, so the C compiler inlines them
cdef class ClusterState:
    """Holder sets of all rows and the caches of all workers; see the module docstring."""
    cdef readonly int n_workers
    cdef readonly int words                  # uint64 words per holder set (PS + workers)
    cdef readonly int64_t n_rows
    cdef readonly int64_t capacity           # cache slots per worker
    cdef readonly bint full_set              # vanilla synchronization: push every trained row
    cdef readonly bint p2p                   # P2P plans: a row one other worker needs goes owner -> worker
    cdef readonly int64_t max_pairs          # (row, worker) needs one iteration may hold
    cdef public int focus                    # worker whose per-sample index set_needs builds (-1: none)
    cdef readonly bint annotate              # mark prefetchable pulls and hash the events (the runtime's needs)
    cdef readonly int threads                # OpenMP threads of set_needs, train and plan (results do not depend on it)
    cdef bint shared                         # threads > 1: shared words are written atomically
    # HET (staleness >= 0; docs/design.md section 7): PS versions (updates pushed per row),
    # and per cache slot the version its value has seen and its updates not yet pushed
    cdef readonly int staleness
    cdef int64_t[::1] version
    cdef int64_t[::1] slot_seen
    cdef int32_t[::1] slot_pending
    cdef int8_t[::1] pair_sync               # HET scratch: refetched with unpushed updates, so pushed now

    # L(e): holders of the latest value of each row, words per row
    cdef uint64_t[::1] holders

    # caches, flattened [worker * capacity + slot]
    cdef int32_t[::1] slot_row               # row in the slot, EMPTY if free
    # Replacement order: per worker, frequency buckets of slots, each a list
    # from most to least recently used. LRU is the case of one bucket; LFU
    # evicts from the lowest non-empty bucket (counts saturate at buckets - 1).
    cdef readonly int buckets
    # slot k of all workers' slots: [2k] more recent, [2k + 1] less (one line); 16 bits each where every
    # slot number fits (lru_links16, NARROW_EMPTY for none), else 32 (lru_links): read through link()
    cdef bint narrow
    cdef uint16_t[::1] lru_links16
    cdef int32_t[::1] lru_links
    # Per worker fields that every cache access may write, each worker's on lines of its own: threads
    # working on neighbouring workers would otherwise pass those lines back and forth (docs/design.md section 3)
    cdef int64_t head_stride                 # buckets rounded up to whole lines
    cdef int32_t[::1] lru_head               # [worker * head_stride + f]: most recent slot of bucket f
    cdef int32_t[::1] lru_tail               # least recent slot of bucket f
    cdef int32_t[::1] freq                   # LFU: bucket of each slot (unused with one bucket)
    cdef int32_t[::1] lowest                 # [worker * LINE]: no non-empty bucket below this one
    cdef int32_t[::1] used                   # [worker * LINE]: slots handed out
    # row -> slot per worker: open addressing over slot ids, [worker * table_size + i]; an entry holds,
    # from its low bits, the slot, its distance from its row's home (saturating at far), a tag of the row
    cdef uint32_t[::1] table
    cdef int64_t table_size
    cdef int slot_bits, tag_shift
    cdef readonly int distance_bits
    cdef uint32_t slot_mask, distance_mask, far

    # Needs of the current iteration: distinct rows (found through an
    # epoch-tagged hash table of batch size: no per-row array), their worker
    # sets, and (worker, row) pairs sorted by worker. Threads insert rows as
    # they come, so a row's index among the needs depends on timing; nothing
    # reads that order (pairs and events follow workers and samples).
    cdef int64_t[::1] need_table             # entry i: [2i] epoch << 32 | row, [2i + 1] epoch << 32 | need index
    cdef int need_shift
    cdef int64_t need_mask
    cdef int need_bits                       # log2 of the table's entries: sized by the rows a batch needs
    cdef int max_need_bits                   # entries for max_pairs distinct rows at load 1/2
    cdef int64_t need_limit                  # indices handed out before the table counts as full
    cdef bint need_overflow                  # set_needs reached need_limit: rebuilt in a larger table
    cdef bint need_bad_row                   # set_needs met a row outside [0, n_rows): refused
    cdef int32_t epoch
    cdef int64_t n_need                      # need indices handed out; a thread's unused ones hold row -1
    cdef int64_t[::1] need_claim             # thread t: next and end of its block of need indices at [8t]
    cdef int64_t[::1] need_rows
    cdef uint64_t[::1] need_masks            # n_need * words, same bit layout as holders
    cdef uint16_t[::1] need_seen             # thread t: [t * seen_stride + need] the stamp of its last worker using it
    cdef int64_t seen_stride                 # need records rounded up to whole lines
    cdef int64_t[::1] seen_stamp             # [8t]: thread t's last stamp (a line each)
    cdef int64_t n_pairs
    cdef int32_t[::1] pair_row               # rows < 2**31, as in the caches
    cdef int16_t[::1] pair_worker             # workers < 2**15
    cdef int32_t[::1] pair_slot
    cdef int32_t[::1] pair_need              # index of the pair's row in need_rows
    cdef int32_t[::1] pair_source            # P2P: worker sending the pair's row (EMPTY: none)
    cdef int32_t[::1] pair_source_slot
    cdef int32_t[::1] need_trainers          # workers needing each row
    cdef int32_t[::1] need_pusher            # plan(): the worker whose pair pushes each row (EMPTY: none)
    cdef readonly int accumulate_rounds      # most trainers of one shared row in the last train() (0: none)
    cdef int64_t[::1] thread_rounds          # update(): [8t] the most that thread t's rows had (a line each)
    cdef int32_t[::1] tmp_row                # set_needs scratch: each worker's pairs at its samples' offset
    cdef int32_t[::1] tmp_need               # (and plan(): the owner pushing each pair's row, or EMPTY)
    cdef int64_t[::1] sample_order           # samples by worker, in batch order within a worker
    cdef int64_t[::1] sample_start           # samples of worker w: sample_order[sample_start[w]:sample_start[w+1]]
    cdef int64_t[::1] worker_fill            # per worker: its pairs (set_needs), its pull events (train)
    cdef int64_t[::1] worker_start           # pairs of worker w: [worker_start[w], worker_start[w+1])
    cdef int64_t[::1] worker_kinds           # events of the last call per worker and kind [w * N_KINDS + kind]
    cdef int64_t[::1] worker_bad             # per worker: -1, or what pull_worker refused
    cdef int64_t[::1] chunk_fill             # plan(): pushes per chunk of pairs, then where the chunk's start
    cdef bint needs_ready
    cdef int n_tables                        # columns of the last set_needs batch
    # focus worker: its samples and, per (sample, table), the position of the row among its pairs
    cdef int32_t[::1] need_focus             # per need: scratch index of the focus worker's pair, or EMPTY
    cdef int64_t[::1] focus_sample
    cdef int32_t[::1] focus_entry
    cdef int64_t n_focus

    # Rows written to the PS (Accumulate, Put, write-back) by iteration t: bit ``row`` of bitmap t & 1.
    # The previous iteration's bitmap decides which pulls are prefetchable. A bitmap lists the words
    # it set, so that emptying it for reuse costs the rows written two iterations before, not n_rows.
    cdef uint64_t[::1] written               # bitmap h: words [h * written_words, (h + 1) * written_words)
    cdef int64_t written_words
    cdef int64_t[::1] written_set            # bitmap h's words in use, from h * written_words on
    cdef int64_t[::1] written_fill           # [8h]: their count (the two a cache line apart)
    cdef readonly int64_t iteration          # train() calls so far, minus one

    # Event records of the last train()/plan() call. After train() they are
    # runs with gaps (each worker's pulls in a region of its own, so workers
    # run in parallel; then one update per pair): ``runs`` lists them in order.
    # Each field as narrow as its values (rows < 2**31, workers < 2**15):
    # three records per pair of the largest batch are most of the scratch.
    cdef int32_t[::1] ev_row
    cdef int16_t[::1] ev_worker
    cdef int32_t[::1] ev_slot
    cdef int8_t[::1] ev_kind
    cdef int32_t[::1] ev_peer                # P2P: the sending worker and its slot, else EMPTY
    cdef int32_t[::1] ev_peer_slot
    cdef int32_t[::1] ev_pair                # updates: position of the row among its worker's pairs
    cdef int8_t[::1] ev_early                # pulls: prefetchable
    cdef int16_t[::1] ev_turn                # Accumulates: how many workers before this one train the row
    cdef int64_t[::1] ev_value               # HET: a version check's expected version, a push's update count
    cdef int64_t n_events                    # events in all runs
    cdef int64_t[::1] runs                   # [2r], [2r + 1]: start and end of run r
    cdef int64_t n_runs
    cdef int64_t[::1] kind_total             # events of the last call by kind
    # After train(), worker w's events are two runs: its pulls (and write-backs, P2P) in
    # [pull_span[2w], pull_span[2w + 1]), and one update per pair at update_base + its pairs.
    cdef int64_t[::1] pull_span
    cdef int64_t update_base
    cdef bint spans_valid                    # False after plan(): plan pushes are in need order
    cdef readonly uint64_t event_digest      # hash of the last call's events
    cdef readonly double needs_seconds       # the last plan()'s set_needs (hybrid bench scheduler's parts)
    cdef int64_t[::1] span_ends              # digest_events: [2b], [2b + 1] the events of span b
    cdef uint64_t[::1] span_hash             # and its hash


    def __init__(self, *, int n_workers, int64_t n_rows, int64_t capacity, bint full_set,
                 int64_t max_pairs, bint p2p=False, str policy="lru", int focus=-1, bint annotate=True,
                 int staleness=-1, int threads=1, int distance_bits=6):
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if n_workers < 1 or n_workers >= 2**15:
            raise ValueError(f"n_workers must be in [1, 2**15), got {n_workers}")
        if n_rows < 1 or n_rows >= 2**31:
            raise ValueError(f"n_rows must be in [1, 2**31), got {n_rows}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 slot, got {capacity}")
        if max_pairs < 1:
            raise ValueError(f"max_pairs must be >= 1, got {max_pairs}")
        if focus < -1 or focus >= n_workers:
            raise ValueError(f"focus must be a worker in [0, {n_workers}) or -1, got {focus}")
        self.n_workers = n_workers
        self.words = (n_workers + 1 + 63) // 64
        self.n_rows = n_rows
        self.capacity = capacity
        if p2p and full_set:
            raise ValueError("P2P plans need on-demand synchronization (full_set=False)")
        if staleness >= 0 and (full_set or p2p):
            raise ValueError("HET's clocks (staleness >= 0) replace full-set and P2P synchronization")
        self.full_set = full_set
        self.p2p = p2p
        self.staleness = max(staleness, -1)
        het = staleness >= 0
        self.version = np.zeros(n_rows if het else 1, dtype=np.int64)
        self.slot_seen = np.zeros(n_workers * capacity if het else 1, dtype=np.int64)
        self.slot_pending = np.zeros(n_workers * capacity if het else 1, dtype=np.int32)
        self.pair_sync = np.zeros(max_pairs if het else 1, dtype=np.int8)
        self.max_pairs = max_pairs
        self.focus = focus
        self.annotate = annotate
        self.threads = threads
        self.shared = threads > 1

        holders = np.zeros((n_rows, self.words), dtype=np.uint64)
        holders[:, 0] = 1  # L(e) = {PS}
        self.holders = holders.reshape(-1)

        self.slot_row = np.full(n_workers * capacity, EMPTY, dtype=np.int32)
        if policy not in ("lru", "lfu"):
            raise ValueError(f"policy must be 'lru' or 'lfu', got {policy!r}")
        self.buckets = 1 if policy == "lru" else LFU_BUCKETS
        self.narrow = capacity <= NARROW_EMPTY  # slots 0 .. NARROW_EMPTY - 1
        self.lru_links16 = np.full(2 * n_workers * capacity if self.narrow else 1, NARROW_EMPTY, dtype=np.uint16)
        self.lru_links = np.full(1 if self.narrow else 2 * n_workers * capacity, EMPTY, dtype=np.int32)
        self.head_stride = (self.buckets + LINE - 1) // LINE * LINE
        self.lru_head = np.full(n_workers * self.head_stride, EMPTY, dtype=np.int32)
        self.lru_tail = np.full(n_workers * self.head_stride, EMPTY, dtype=np.int32)
        self.freq = np.zeros(n_workers * capacity if self.buckets > 1 else 1, dtype=np.int32)
        self.lowest = np.zeros(n_workers * LINE, dtype=np.int32)
        self.used = np.zeros(n_workers * LINE, dtype=np.int32)
        self.table_size = capacity + capacity // 2 + 1  # load <= 2/3
        self.table = np.full(n_workers * self.table_size, TABLE_EMPTY, dtype=np.uint32)
        # one bit more than the largest slot needs, so that no entry is TABLE_EMPTY; what is left of 32 bits
        # goes to the distance (at most half of it: the tag keeps the rest; tests ask for fewer bits, so that
        # distances saturate in small tables too)
        self.slot_bits = int(capacity).bit_length()
        self.distance_bits = max(0, min(distance_bits, (32 - self.slot_bits) // 2))
        self.tag_shift = self.slot_bits + self.distance_bits
        self.slot_mask = (1 << self.slot_bits) - 1
        self.far = (1 << self.distance_bits) - 1
        self.distance_mask = self.far << self.slot_bits

        cdef int bits = table_bits(2 * max_pairs)  # load <= 1/2
        self.max_need_bits = bits
        self.size_needs(min(bits, max(MIN_NEED_BITS, table_bits(4 * threads * NEED_BLOCK))))
        self.epoch = 0
        self.need_claim = np.zeros(8 * threads, dtype=np.int64)  # a cache line per thread
        self.seen_stamp = np.zeros(8 * threads, dtype=np.int64)
        self.pair_row = np.zeros(max_pairs, dtype=np.int32)
        self.pair_worker = np.zeros(max_pairs, dtype=np.int16)
        self.pair_slot = np.zeros(max_pairs, dtype=np.int32)
        self.pair_need = np.zeros(max_pairs, dtype=np.int32)
        self.pair_source = np.full(max_pairs if p2p else 1, EMPTY, dtype=np.int32)  # P2P's only (source())
        self.pair_source_slot = np.full(max_pairs if p2p else 1, EMPTY, dtype=np.int32)
        self.accumulate_rounds = 0
        self.tmp_row = np.zeros(max_pairs, dtype=np.int32)
        self.tmp_need = np.zeros(max_pairs, dtype=np.int32)
        self.sample_order = np.zeros(0, dtype=np.int64)  # sized by set_needs to the largest batch's samples
        self.sample_start = np.zeros(n_workers + 1, dtype=np.int64)
        self.worker_fill = np.zeros(n_workers + 1, dtype=np.int64)
        self.worker_start = np.zeros(n_workers + 1, dtype=np.int64)
        self.worker_kinds = np.zeros(n_workers * N_KINDS, dtype=np.int64)
        self.worker_bad = np.full(n_workers, -1, dtype=np.int64)
        self.chunk_fill = np.zeros(8 * threads + 1, dtype=np.int64)
        self.thread_rounds = np.zeros(8 * threads, dtype=np.int64)
        self.n_need = 0
        self.n_pairs = 0
        self.needs_ready = False
        self.n_tables = 0
        self.focus_sample = np.zeros(0, dtype=np.int64)
        self.focus_entry = np.zeros(0, dtype=np.int32)  # sized by set_needs to the focus worker's entries
        self.n_focus = 0

        self.written_words = (n_rows + 63) // 64
        self.written = np.zeros(2 * self.written_words, dtype=np.uint64)
        self.written_set = np.zeros(2 * self.written_words, dtype=np.int64)
        self.written_fill = np.zeros(16, dtype=np.int64)
        self.iteration = -1

        cdef int64_t n_ev = (4 if het else 3) * max_pairs  # HET: check, pull and an eviction per pair, + update
        self.ev_row = np.zeros(n_ev, dtype=np.int32)
        self.ev_worker = np.zeros(n_ev, dtype=np.int16)
        self.ev_slot = np.zeros(n_ev, dtype=np.int32)
        self.ev_kind = np.zeros(n_ev, dtype=np.int8)
        # fields of some modes' events only: a placeholder elsewhere (read only for those kinds, see record())
        self.ev_peer = np.zeros(n_ev if p2p else 1, dtype=np.int32)
        self.ev_peer_slot = np.zeros(n_ev if p2p else 1, dtype=np.int32)
        self.ev_pair = np.zeros(n_ev, dtype=np.int32)
        self.ev_early = np.zeros(n_ev, dtype=np.int8)
        self.ev_turn = np.zeros(n_ev, dtype=np.int16)
        self.ev_value = np.zeros(n_ev if het else 1, dtype=np.int64)
        self.kind_total = np.zeros(N_KINDS, dtype=np.int64)
        self.pull_span = np.zeros(2 * n_workers, dtype=np.int64)
        self.update_base = 0
        self.spans_valid = False
        self.n_events = 0
        self.runs = np.zeros(2 * (n_workers + 1), dtype=np.int64)
        self.n_runs = 0
        self.span_ends = np.zeros(2 * (n_ev // DIGEST_SPAN + n_workers + 2), dtype=np.int64)
        self.span_hash = np.zeros(n_ev // DIGEST_SPAN + n_workers + 2, dtype=np.uint64)
        self.event_digest = 0

    # ---------------------------------------------------------------- holders
    cdef inline bint has_bit(self, int64_t row, int bit) noexcept nogil:
        return (self.holders[row * self.words + (bit >> 6)] >> (bit & 63)) & 1

    # Workers' threads set and clear their own bits of rows other workers touch too: atomically.
    cdef inline void set_bit(self, int64_t row, int bit) noexcept nogil:
        or_u64_if(&self.holders[row * self.words + (bit >> 6)], (<uint64_t>1) << (bit & 63), self.shared)

    cdef inline void clear_bit(self, int64_t row, int bit) noexcept nogil:
        and_u64_if(&self.holders[row * self.words + (bit >> 6)], ~((<uint64_t>1) << (bit & 63)), self.shared)

    cdef inline void set_only(self, int64_t row, int bit) noexcept nogil:
        """``L(row) = {bit}``; callers own the row for the moment (no other thread touches it)."""
        cdef int k
        for k in range(self.words):
            self.holders[row * self.words + k] = 0
        self.set_bit(row, bit)

    cdef bint fresh(self, int64_t row, int worker) noexcept nogil:
        return self.has_bit(row, worker + 1)

    cdef inline int dirty_owner(self, int64_t row) noexcept nogil:
        """The worker holding the only latest copy of ``row`` (not the PS), else -1."""
        cdef int k, count = 0, bit = -1
        cdef uint64_t x
        for k in range(self.words):
            x = self.holders[row * self.words + k]
            if x:
                count += popcount64(x)
                bit = 64 * k + ctz64(x)
        if count != 1 or bit == PS_BIT:
            return -1
        return bit - 1

    # ------------------------------------------------------------ row -> slot
    # Four-byte entries (docs/design.md section 3, memory). The tag rules out
    # almost every other row on a probe without reading slot_row, where a
    # match is confirmed; the distance gives an entry's home when a deletion
    # shifts entries back, without reading slot_row either (but where it
    # saturated). Linear probing, deletion by backward shift (no tombstones).
    cdef inline int64_t home(self, int64_t row) noexcept nogil:
        return <int64_t>(((row_hash(row) & LOW32) * <uint64_t>self.table_size) >> 32)

    cdef inline uint32_t tag(self, int64_t row) noexcept nogil:
        """An entry's tag bits for ``row`` (its distance bits 0)."""
        return <uint32_t>((row_hash(row) >> 32) << self.tag_shift)

    cdef inline uint32_t mark(self, int64_t row, int64_t distance) noexcept nogil:
        """An entry's bits above the slot for ``row`` ``distance`` entries past its home."""
        return self.tag(row) | (<uint32_t>min(distance, <int64_t>self.far) << self.slot_bits)

    cdef inline int64_t entry_home(self, int w, int64_t i, uint32_t entry) noexcept nogil:
        """The home of the entry at ``i``: from its distance, or from its row where the distance saturated."""
        cdef int64_t d = (entry & self.distance_mask) >> self.slot_bits
        if d == self.far:
            return self.home(self.slot_row[w * self.capacity + (entry & self.slot_mask)])
        return i - d if i >= d else i - d + self.table_size

    cdef inline int64_t probe(self, int w, int64_t row, bint confirm) noexcept nogil:
        """Where the first entry on ``row``'s probe that bears its mark is (from the table's start), or -1:
        ``row`` is not cached, for certain. With ``confirm``, one whose slot holds ``row``: its own;
        without, almost always its own too (another row's needs the same tag at the same distance)."""
        cdef int64_t base = w * self.table_size, cbase = w * self.capacity
        cdef int64_t i = self.home(row), d = 0
        cdef uint32_t entry, want = self.tag(row)
        while True:
            entry = self.table[base + i]
            if entry == TABLE_EMPTY:
                return -1
            if (entry & ~self.slot_mask) == want and \
                    (not confirm or self.slot_row[cbase + (entry & self.slot_mask)] == row):
                return i
            if d < self.far:  # the mark one entry further on
                want += self.slot_mask + 1
            d += 1
            i += 1
            if i == self.table_size:
                i = 0

    cdef inline int64_t position(self, int w, int64_t row) noexcept nogil:
        """Where ``row``'s entry is in ``w``'s table (from the table's start), or -1: not cached."""
        return self.probe(w, row, True)

    cdef inline int32_t probed_slot(self, int w, int64_t row, bint confirm) noexcept nogil:
        """The slot :meth:`probe` finds, or EMPTY."""
        cdef int64_t i = self.probe(w, row, confirm)
        return EMPTY if i < 0 else <int32_t>(self.table[w * self.table_size + i] & self.slot_mask)

    cdef inline int32_t tag_match(self, int w, int64_t row) noexcept nogil:
        """The slot the first entry bearing ``row``'s mark names: ``row``'s slot if it is cached, almost
        always (confirm in slot_row); EMPTY: it is not cached, for certain."""
        return self.probed_slot(w, row, False)

    cdef inline int32_t find(self, int w, int64_t row) noexcept nogil:
        """``row``'s slot in ``w``'s cache, or EMPTY."""
        return self.probed_slot(w, row, True)

    cdef inline void map_insert(self, int w, int64_t row, int32_t slot) noexcept nogil:
        cdef int64_t base = w * self.table_size
        cdef int64_t i = self.home(row), d = 0
        while self.table[base + i] != TABLE_EMPTY:
            d += 1
            i += 1
            if i == self.table_size:
                i = 0
        self.table[base + i] = self.mark(row, d) | <uint32_t>slot

    cdef void map_erase(self, int w, int64_t row) noexcept nogil:
        """Remove ``row``'s entry (``row`` still in its slot), moving later entries of its run back."""
        cdef int64_t base = w * self.table_size
        cdef int64_t i = self.position(w, row), j = i, h, d
        cdef uint32_t entry
        while True:
            j += 1
            if j == self.table_size:
                j = 0
            entry = self.table[base + j]
            if entry == TABLE_EMPTY:
                break
            h = self.entry_home(w, j, entry)
            # move the entry back into the hole at i unless its home lies cyclically in (i, j]
            if (j > i and (h <= i or h > j)) or (j < i and (h <= i and h > j)):
                d = i - h if i >= h else i - h + self.table_size
                self.table[base + i] = (entry & ~self.distance_mask) | \
                    (<uint32_t>min(d, <int64_t>self.far) << self.slot_bits)
                i = j
        self.table[base + i] = TABLE_EMPTY

    cdef void map_rebuild(self) noexcept nogil:
        """Every worker's table from its slots (a loaded state: the tables are not saved)."""
        cdef int w
        cdef int32_t s
        cdef int64_t i
        for i in range(self.table.shape[0]):
            self.table[i] = TABLE_EMPTY
        for w in range(self.n_workers):
            for s in range(self.used[w * LINE]):
                if self.slot_row[w * self.capacity + s] != EMPTY:
                    self.map_insert(w, self.slot_row[w * self.capacity + s], s)

    # ------------------------------------------------------ replacement order
    cdef inline int32_t link(self, int64_t i) noexcept nogil:
        """Replacement link ``i`` (``[2k]``: the slot used more recently than slot k, ``[2k + 1]``: less), or
        EMPTY."""
        cdef uint16_t v
        if self.narrow:
            v = self.lru_links16[i]
            return EMPTY if v == NARROW_EMPTY else <int32_t>v
        return self.lru_links[i]

    cdef inline void set_link(self, int64_t i, int32_t s) noexcept nogil:
        if self.narrow:
            self.lru_links16[i] = <uint16_t>s  # EMPTY: NARROW_EMPTY
        else:
            self.lru_links[i] = s

    cdef inline const void* link_address(self, int64_t i) noexcept nogil:
        if self.narrow:
            return <const void*>&self.lru_links16[i]
        return <const void*>&self.lru_links[i]

    cdef inline int32_t bucket_of(self, int w, int32_t s) noexcept nogil:
        return self.freq[w * self.capacity + s] if self.buckets > 1 else 0

    cdef inline void lru_unlink(self, int w, int32_t s) noexcept nogil:
        cdef int64_t b = w * self.capacity
        cdef int64_t head = w * self.head_stride + self.bucket_of(w, s)
        cdef int32_t p = self.link(2 * (b + s)), n = self.link(2 * (b + s) + 1)
        if p != EMPTY:
            self.set_link(2 * (b + p) + 1, n)
        else:
            self.lru_head[head] = n
        if n != EMPTY:
            self.set_link(2 * (b + n), p)
        else:
            self.lru_tail[head] = p

    cdef inline void lru_push_front(self, int w, int32_t s) noexcept nogil:
        cdef int64_t b = w * self.capacity
        cdef int32_t f = self.bucket_of(w, s)
        cdef int64_t head = w * self.head_stride + f
        self.set_link(2 * (b + s), EMPTY)
        self.set_link(2 * (b + s) + 1, self.lru_head[head])
        if self.lru_head[head] != EMPTY:
            self.set_link(2 * (b + self.lru_head[head]), s)
        else:
            self.lru_tail[head] = s
        self.lru_head[head] = s
        if f < self.lowest[w * LINE]:
            self.lowest[w * LINE] = f

    cdef inline void lru_touch(self, int w, int32_t s) noexcept nogil:
        """An access: most recent in LRU; one bucket up (most recent there) in LFU."""
        cdef int64_t b = w * self.capacity
        if self.buckets == 1:
            if self.lru_head[w * self.head_stride] != s:
                self.lru_unlink(w, s)
                self.lru_push_front(w, s)
            return
        self.lru_unlink(w, s)
        if self.freq[b + s] < self.buckets - 1:
            self.freq[b + s] += 1
        self.lru_push_front(w, s)

    cdef inline void lru_insert(self, int w, int32_t s) noexcept nogil:
        """A newly cached row: accessed once."""
        if self.buckets > 1:
            self.freq[w * self.capacity + s] = 1
        self.lru_push_front(w, s)

    cdef inline int32_t victim(self, int w) noexcept nogil:
        """Least recent slot of the lowest bucket whose least recent row is not needed now.

        With one bucket the tail is never needed now (needed rows were touched
        first); in LFU a low bucket may hold only rows inserted this iteration.
        """
        cdef int32_t f, s
        for f in range(self.lowest[w * LINE], self.buckets):
            s = self.lru_tail[w * self.head_stride + f]
            if s == EMPTY:
                if f == self.lowest[w * LINE]:
                    self.lowest[w * LINE] = f + 1
                continue
            if not self.needed_by(self.slot_row[w * self.capacity + s], w):
                return s
        return EMPTY

    cdef inline int32_t free_or_victim(self, int w) noexcept nogil:
        """A slot for a row ``w`` fetches: a free one, or the replacement victim's (EMPTY: none)."""
        cdef int32_t s
        if self.used[w * LINE] < self.capacity:
            s = self.used[w * LINE]
            self.used[w * LINE] += 1
            return s
        return self.victim(w)

    cdef inline void install(self, int w, int64_t row, int32_t s) noexcept nogil:
        """Put ``row`` in ``w``'s slot ``s``, dropping the row it held (the caller settled its value)."""
        cdef int64_t k = w * self.capacity + s
        if self.slot_row[k] != EMPTY:
            self.map_erase(w, self.slot_row[k])
            self.lru_unlink(w, s)
        self.slot_row[k] = <int32_t>row
        self.map_insert(w, row, s)
        self.lru_insert(w, s)

    # ------------------------------------------------------------ needs table
    # A batch repeats rows (Criteo-like, 128 workers: 1 distinct row in 15 to 45 entries), so the
    # table is sized by the rows the last batch needed, not by max_pairs: one that fits the caches
    # saves a miss per entry. Entries of other epochs count as free, so it is never cleared.
    cdef void size_needs(self, int bits):
        """A fresh needs table of ``2 ** bits`` entries (load <= 1/2, plus a block per thread)."""
        self.need_bits = bits
        self.need_shift = 64 - bits
        self.need_mask = (<int64_t>1 << bits) - 1
        self.need_table = np.zeros(2 << bits, dtype=np.int64)
        # the largest table holds max_pairs rows at load <= 1/2: it never needs to grow
        self.need_limit = (<int64_t>1 << bits) // 2 if bits < self.max_need_bits else INT64_MAX
        # the need records follow the table: indices stop a block per thread past need_limit at most
        cdef int64_t needs = min(self.need_limit, self.max_pairs) + self.threads * NEED_BLOCK
        if self.need_rows is None or self.need_rows.shape[0] != needs:
            self.need_rows = np.zeros(needs, dtype=np.int64)
            self.need_masks = np.zeros(needs * self.words, dtype=np.uint64)
            self.need_trainers = np.zeros(needs, dtype=np.int32)
            self.need_pusher = np.full(needs, EMPTY, dtype=np.int32)
            self.need_focus = np.full(needs, EMPTY, dtype=np.int32)
            self.seen_stride = (needs + 31) // 32 * 32
            self.need_seen = np.zeros(self.threads * self.seen_stride, dtype=np.uint16)

    cdef inline int64_t need_index(self, int64_t row) noexcept nogil:
        """Index of ``row`` among this iteration's needed rows, or -1 (once the needs are set)."""
        cdef int64_t i = fib_home(row, self.need_shift)
        cdef int64_t epoch_bits = (<int64_t>self.epoch) << 32, key = epoch_bits | row, entry
        while True:
            entry = self.need_table[2 * i]
            if entry == key:
                return self.need_table[2 * i + 1] & LOW32
            if (entry & ~LOW32) != epoch_bits:
                return -1
            i = (i + 1) & self.need_mask

    cdef inline int64_t need_of(self, int64_t row, int thread) noexcept nogil:
        """:meth:`need_insert`, its common case inline: a row of the batch seen before, in its home entry."""
        cdef int64_t i = fib_home(row, self.need_shift)
        cdef int64_t epoch_bits = (<int64_t>self.epoch) << 32, tag
        if load_i64(&self.need_table[2 * i]) == (epoch_bits | row):
            tag = load_i64(&self.need_table[2 * i + 1])
            if (tag & ~LOW32) == epoch_bits:
                return tag & LOW32
        return self.need_insert(row, thread)

    cdef int64_t need_insert(self, int64_t row, int thread) noexcept nogil:
        """Index of ``row`` among the needs being set; the first thread to see it gives it an index.

        A thread claims a free entry by compare-and-swap of its key, takes
        the next index of its own block, records the row, then publishes
        the index; a thread finding the key waits for the index
        (the claimer is a few instructions away). A thread that needs a new
        block once ``need_limit`` indices are out claims nothing more and
        returns -1 (``need_overflow``): the table is full enough to rebuild.
        """
        cdef int64_t i = fib_home(row, self.need_shift)
        cdef int64_t epoch_bits = (<int64_t>self.epoch) << 32, key = epoch_bits | row, entry, tag, n
        while True:
            entry = load_i64(&self.need_table[2 * i])
            if entry == key:
                while True:
                    tag = load_i64(&self.need_table[2 * i + 1])
                    if (tag & ~LOW32) == epoch_bits:
                        return tag & LOW32
            if (entry & ~LOW32) == epoch_bits:  # another row of this batch
                i = (i + 1) & self.need_mask
                continue
            if self.need_claim[8 * thread] == self.need_claim[8 * thread + 1]:  # a block first
                if load_i64(&self.n_need) + NEED_BLOCK > self.need_limit:  # threads pass it by a block each
                    self.need_overflow = True
                    return -1
                self.need_claim[8 * thread] = fetch_add_i64(&self.n_need, NEED_BLOCK)
                self.need_claim[8 * thread + 1] = self.need_claim[8 * thread] + NEED_BLOCK
            if cas_i64_if(&self.need_table[2 * i], entry, key, self.shared):
                n = self.need_claim[8 * thread]
                self.need_claim[8 * thread] += 1
                self.need_rows[n] = row
                store_i64(&self.need_table[2 * i + 1], epoch_bits | n)
                return n
            # else another thread took this entry first: look at it again

    cdef inline bint needed_by(self, int64_t row, int w) noexcept nogil:
        cdef int bit = w + 1
        cdef int64_t k = self.need_index(row)
        if k < 0:
            return False
        return (self.need_masks[k * self.words + (bit >> 6)] >> (bit & 63)) & 1

    # ------------------------------------------------------- written-row sets
    cdef void clear_written(self, int64_t iteration) noexcept nogil:
        """Empty bitmap ``iteration & 1`` for ``iteration``'s rows (it held those of two iterations before)."""
        cdef int64_t h = iteration & 1, k, base = h * self.written_words
        for k in range(self.written_fill[8 * h]):
            self.written[base + self.written_set[base + k]] = 0
        self.written_fill[8 * h] = 0

    cdef inline void mark_written(self, int64_t row) noexcept nogil:
        """``row`` is written to the PS in the current iteration (threads may mark at once)."""
        cdef int64_t h = self.iteration & 1, word = h * self.written_words + (row >> 6), k
        cdef uint64_t bit = (<uint64_t>1) << (row & 63), before
        if self.written[word] & bit:  # a plain read tells: most rows are marked by several events
            return
        if self.shared:
            before = fetch_or_u64(&self.written[word], bit)
        else:
            before = self.written[word]
            self.written[word] = before | bit
        if before == 0:  # the word's first bit: exactly one thread sees it, and lists the word
            if self.shared:
                k = fetch_add_i64(&self.written_fill[8 * h], 1)
            else:
                k = self.written_fill[8 * h]
                self.written_fill[8 * h] = k + 1
            self.written_set[h * self.written_words + k] = row >> 6

    cdef inline bint written_before(self, int64_t row) noexcept nogil:
        """Whether the previous iteration wrote ``row`` to the PS."""
        cdef int64_t word = ((self.iteration - 1) & 1) * self.written_words + (row >> 6)
        return (self.written[word] >> (row & 63)) & 1

    # ----------------------------------------------------------------- events
    cdef inline void record(self, int64_t n, int kind, int w, int64_t row, int32_t slot, int32_t pair) noexcept nogil:
        """Event ``n``: its position is the caller's (each worker's thread fills a region of its own).

        The fields of some kinds only are the callers' to write, and read for
        those kinds only: a P2P event's peer, a pull's ``early`` (set after,
        when annotating), a HET event's value. Most events are pulls and
        updates: writing fields nobody reads would cost a quarter of the bytes.
        """
        self.ev_kind[n] = <int8_t>kind
        self.ev_worker[n] = <int16_t>w
        self.ev_row[n] = <int32_t>row
        self.ev_slot[n] = slot
        self.ev_pair[n] = pair
        if kind == K_PULL:
            self.ev_early[n] = 0

    cdef void start_events(self) noexcept nogil:
        cdef int64_t k
        self.n_events = 0
        self.n_runs = 0
        self.spans_valid = False
        for k in range(N_KINDS):
            self.kind_total[k] = 0
        for k in range(self.n_workers * N_KINDS):
            self.worker_kinds[k] = 0

    cdef void add_run(self, int64_t start, int64_t end) noexcept nogil:
        """Events ``[start, end)`` come next in execution order."""
        if end > start:
            self.runs[2 * self.n_runs] = start
            self.runs[2 * self.n_runs + 1] = end
            self.n_runs += 1
            self.n_events += end - start

    cdef inline void add_kinds(self, int w, const int64_t* kinds) noexcept nogil:
        cdef int k
        for k in range(N_KINDS):
            self.worker_kinds[w * N_KINDS + k] += kinds[k]

    cdef void total_kinds(self) noexcept nogil:
        """The call's events by kind, from each worker's counts."""
        cdef int64_t w, k
        for w in range(self.n_workers):
            for k in range(N_KINDS):
                self.kind_total[k] += self.worker_kinds[w * N_KINDS + k]

    cdef inline uint64_t event_word(self, int64_t i) noexcept nogil:
        """Event ``i``'s fields in one word. A digest, not a checksum of record: fields share bits, and
        a divergence changes the digest all the same."""
        cdef int kind = self.ev_kind[i]
        cdef uint64_t fields = <uint64_t>self.ev_row[i] | (<uint64_t><uint32_t>self.ev_slot[i] << 32)
        cdef uint64_t more = <uint64_t><uint32_t>self.ev_worker[i] | (<uint64_t>kind << 32)
        if kind == K_PULL:  # the fields of one kind only: see record()
            more |= <uint64_t>self.ev_early[i] << 40
        elif kind == K_P2P:
            more ^= (<uint64_t><uint32_t>self.ev_peer[i] << 8) ^ (<uint64_t><uint32_t>self.ev_peer_slot[i] << 44)
        elif kind == K_VERSION_CHECK or kind == K_DELTA_PUSH or kind == K_DELTA_WRITEBACK:
            more ^= <uint64_t>self.ev_value[i] * GOLDEN
        return fields ^ ((more << 17) | (more >> 47))

    cdef uint64_t digest_span(self, int64_t first, int64_t last) noexcept nogil:
        """Hash of events ``[first, last)``: four chains, one per event of every four (``counter_hash.chain64``)."""
        cdef uint64_t n = <uint64_t>(last - first)
        cdef uint64_t a = n, b = n + 1, c = n + 2, d = n + 3
        cdef int64_t i = first
        while i + 4 <= last:
            a = chain64(a, self.event_word(i))
            b = chain64(b, self.event_word(i + 1))
            c = chain64(c, self.event_word(i + 2))
            d = chain64(d, self.event_word(i + 3))
            i += 4
        while i < last:
            a = chain64(a, self.event_word(i))
            i += 1
        return fold4(a, b, c, d)

    cdef void digest_events(self) noexcept nogil:
        """A hash of the recorded events, in order (every rank records them in the same order).

        It runs every iteration, so it must cost little next to recording the
        events: spans of ``DIGEST_SPAN`` events are hashed in parallel, then
        chained in order, so the digest is the same at any thread count.
        """
        cdef int64_t r, start, b, n_spans = 0
        cdef uint64_t h = <uint64_t>self.n_events
        if not self.annotate:
            self.event_digest = 0
            return
        for r in range(self.n_runs):  # the spans: each run cut every DIGEST_SPAN events
            start = self.runs[2 * r]
            while start < self.runs[2 * r + 1]:
                self.span_ends[2 * n_spans] = start
                start = min(start + DIGEST_SPAN, self.runs[2 * r + 1])
                self.span_ends[2 * n_spans + 1] = start
                n_spans += 1
        for b in prange(n_spans, num_threads=self.threads, schedule="dynamic"):  # spans: a worker's pulls or 8,192
            self.span_hash[b] = self.digest_span(self.span_ends[2 * b], self.span_ends[2 * b + 1])
        for b in range(n_spans):
            h = mix64(h ^ self.span_hash[b])
        self.event_digest = h

    # ------------------------------------------------------------------ needs
    def set_needs(self, const int64_t[:, ::1] rows, const int32_t[::1] alloc):
        """Needs of the next iteration to train: sample ``i`` (rows ``rows[i]``) on ``alloc[i]``.

        A refused batch (a ValueError) leaves no needs: ``train()`` then asks for new ones.
        """
        if rows.shape[0] != alloc.shape[0]:
            raise ValueError(f"rows has {rows.shape[0]} samples but alloc has {alloc.shape[0]}")
        if rows.shape[0] * rows.shape[1] > self.max_pairs:
            raise ValueError(f"batch of {rows.shape[0]} x {rows.shape[1]} ids exceeds max_pairs={self.max_pairs}")
        if rows.shape[0] == 0:
            raise ValueError("an empty batch has no needs")
        bad = np.flatnonzero((np.asarray(alloc) < 0) | (np.asarray(alloc) >= self.n_workers))
        if len(bad):
            raise ValueError(f"alloc[{bad[0]}] = {alloc[bad[0]]} is not a worker in [0, {self.n_workers})")
        if rows.shape[0] > self.sample_order.shape[0]:
            self.sample_order = np.zeros(rows.shape[0], dtype=np.int64)
            self.focus_sample = np.zeros(rows.shape[0], dtype=np.int64)
        if self.focus >= 0:
            entries = int(np.count_nonzero(np.asarray(alloc) == self.focus)) * rows.shape[1]
            if entries > self.focus_entry.shape[0]:
                self.focus_entry = np.zeros(entries, dtype=np.int32)
        self.needs_ready = False  # gathering overwrites the earlier needs, and may refuse this batch
        cdef int bits = min(self.max_need_bits, max(MIN_NEED_BITS, 1 + table_bits(max(self.n_need, 1))))
        if bits > self.need_bits or bits + 2 < self.need_bits:  # grow, or shrink after a larger batch
            self.size_needs(bits)
        while not self.gather_needs(rows, alloc):
            if self.need_bad_row:  # found while gathering: a pass of its own would cost as much as one
                where = np.argwhere((np.asarray(rows) < 0) | (np.asarray(rows) >= self.n_rows))[0]
                raise ValueError(f"rows[{where[0]}, {where[1]}] = {np.asarray(rows)[tuple(where)]} "
                                 f"is not a row in [0, {self.n_rows})")
            if self.need_bits == self.max_need_bits:  # it holds max_pairs rows: cannot fill
                raise StateError(f"the needs table of {1 << self.need_bits} entries filled")
            self.size_needs(min(self.max_need_bits, self.need_bits + 2))
        self.needs_ready = True

    cdef bint gather_needs(self, const int64_t[:, ::1] rows, const int32_t[::1] alloc):
        """:meth:`set_needs` in the current needs table; False if it filled (nothing else is valid then)."""
        cdef int64_t i, k
        cdef int w, t
        cdef int focus = self.focus
        self.need_overflow = False
        self.need_bad_row = False
        with nogil:
            self.epoch += 1
            self.n_need = 0
            self.n_tables = rows.shape[1]
            # samples by worker, batch order within (a counting sort)
            for w in range(self.n_workers + 1):
                self.sample_start[w] = 0
            for i in range(rows.shape[0]):
                self.sample_start[alloc[i] + 1] += 1
            for w in range(self.n_workers):
                self.sample_start[w + 1] += self.sample_start[w]
            for w in range(self.n_workers):
                self.worker_fill[w] = self.sample_start[w]
            for i in range(rows.shape[0]):
                self.sample_order[self.worker_fill[alloc[i]]] = i
                self.worker_fill[alloc[i]] += 1
            self.n_focus = 0
            if focus >= 0:
                for k in range(self.sample_start[focus], self.sample_start[focus + 1]):
                    self.focus_sample[self.n_focus] = self.sample_order[k]
                    self.n_focus += 1
            for k in range(8 * self.threads):
                self.need_claim[k] = 0
            for w in prange(self.n_workers, num_threads=self.threads, schedule="dynamic"):
                self.worker_fill[w] = self.collect_pairs(rows, w, threadid())
            if self.need_overflow or self.need_bad_row:
                return False
            for t in range(self.threads):  # the indices threads took but did not use: no row
                for k in range(self.need_claim[8 * t], self.need_claim[8 * t + 1]):
                    self.need_rows[k] = -1
            for t in prange(self.threads, num_threads=self.threads, schedule="static"):
                self.set_trainers(t)
            self.worker_start[0] = 0
            for w in range(self.n_workers):
                self.worker_start[w + 1] = self.worker_start[w] + self.worker_fill[w]
            self.n_pairs = self.worker_start[self.n_workers]
            for w in prange(self.n_workers, num_threads=self.threads, schedule="dynamic"):
                self.place_pairs(w)
        return True

    cdef int64_t collect_pairs(self, const int64_t[:, ::1] rows, int w, int thread) noexcept nogil:
        """Worker ``w``'s needed rows, in order of first use by its samples, at its samples' offset in the scratch.

        Two passes over ``w``'s (sample, table) entries, so that each keeps
        its misses in flight: the first finds every entry's need index (the
        needs table), the second keeps each row's first use. A row's first
        use by ``w`` is told by the thread's own stamps, not by the row's
        worker bits, which the threads of other workers would be writing
        (:meth:`set_trainers` sets those afterwards): the order is the
        batch's, whatever the threads. Returns the rows' count.
        """
        cdef int64_t n_tables = rows.shape[1], base = self.sample_start[w] * n_tables, n = 0, k = 0
        cdef int64_t j, t, i, need
        cdef int64_t last = self.sample_start[w + 1]
        cdef bint focus = w == self.focus
        cdef uint16_t* seen = &self.need_seen[thread * self.seen_stride]
        cdef uint16_t stamp
        if self.seen_stamp[8 * thread] == 0xFFFF:  # every stamp used: start again from clear stamps
            memset(seen, 0, self.seen_stride * sizeof(uint16_t))
            self.seen_stamp[8 * thread] = 0
        self.seen_stamp[8 * thread] += 1
        stamp = <uint16_t>self.seen_stamp[8 * thread]
        for j in range(self.sample_start[w], last):  # tmp_need[base + k]: entry k's need index
            if j + 4 < last:  # the ids of the fourth sample on, the needs-table entries of the second
                for t in range(0, n_tables, 8):
                    prefetch(&rows[self.sample_order[j + 4], t])
            if j + 2 < last:
                i = self.sample_order[j + 2]
                for t in range(n_tables):
                    prefetch(&self.need_table[2 * fib_home(rows[i, t], self.need_shift)])
            i = self.sample_order[j]
            for t in range(n_tables):
                if <uint64_t>rows[i, t] >= <uint64_t>self.n_rows:  # negative ones too
                    self.need_bad_row = True
                    return 0
                need = self.need_of(rows[i, t], thread)
                if need < 0:  # the table is full: set_needs starts again in a larger one
                    return 0
                self.tmp_need[base + k] = <int32_t>need
                k += 1
        k = 0
        for j in range(self.sample_start[w], last):  # compacts in place: pair n lands where entry k >= n was
            i = self.sample_order[j]
            for t in range(n_tables):
                need = self.tmp_need[base + k]
                if seen[need] != stamp:
                    seen[need] = stamp
                    self.tmp_row[base + n] = <int32_t>rows[i, t]
                    self.tmp_need[base + n] = <int32_t>need
                    if focus:
                        self.need_focus[need] = <int32_t>n
                    n += 1
                if focus:
                    self.focus_entry[k] = self.need_focus[need]
                k += 1
        return n

    cdef void set_trainers(self, int part) noexcept nogil:
        """The worker bits of need records in part ``part`` of ``threads`` (a range of indices), and their counts.

        Each thread reads every worker's pairs and writes the records of its
        range only: set from the workers' threads, a frequent row's record
        passed between the cores once per worker using it (on two threads,
        its bits took longer than on one). Ranges start at multiples of 8
        records, so neighbouring ones share no cache line past an edge.
        """
        cdef int64_t lo = (self.n_need * part // self.threads) & ~7
        cdef int64_t hi = self.n_need if part == self.threads - 1 else (self.n_need * (part + 1) // self.threads) & ~7
        cdef uint64_t span = <uint64_t>(hi - lo)
        cdef int64_t base, k, need
        cdef int w, bit
        cdef uint64_t flag
        if hi <= lo:
            return
        memset(&self.need_masks[lo * self.words], 0, (hi - lo) * self.words * sizeof(uint64_t))
        for w in range(self.n_workers):
            base = self.sample_start[w] * self.n_tables
            bit = w + 1
            flag = (<uint64_t>1) << (bit & 63)
            for k in range(self.worker_fill[w]):
                need = self.tmp_need[base + k]
                if <uint64_t>(need - lo) < span:
                    self.need_masks[need * self.words + (bit >> 6)] |= flag
        for k in range(lo, hi):
            self.need_trainers[k] = self.count_trainers(k)

    cdef int32_t count_trainers(self, int64_t need) noexcept nogil:
        """Workers needing row ``need``."""
        cdef int k
        cdef int32_t count = 0
        for k in range(self.words):
            count += popcount64(self.need_masks[need * self.words + k])
        return count

    cdef void place_pairs(self, int w) noexcept nogil:
        """Worker ``w``'s pairs from the scratch to their place among all pairs (sorted by worker)."""
        cdef int64_t base = self.sample_start[w] * self.n_tables, first = self.worker_start[w], k, p
        for k in range(self.worker_start[w + 1] - first):
            p = first + k
            self.pair_row[p] = self.tmp_row[base + k]
            self.pair_worker[p] = <int16_t>w
            self.pair_need[p] = self.tmp_need[base + k]
            self.pair_slot[p] = EMPTY
            if self.p2p:
                self.pair_source[p] = EMPTY

    # ------------------------------------------------------------------ train
    def train(self):
        """Pull and update for the current needs (steps 2 and 4). Returns event counts.

        Workers pull in parallel (``threads``), each into an event region of
        its own; the events, the state and the digest are those of one thread.
        """
        if not self.needs_ready:
            raise StateError("train() needs set_needs() (or the previous plan()) first")
        cdef int w, bad_worker = -1
        cdef int64_t per_pair = 3 if self.staleness >= 0 else 2  # most pull-side events of one pair
        with nogil:
            self.iteration += 1
            self.clear_written(self.iteration)
            self.start_events()
            if self.p2p:
                self.match_p2p()
            for w in prange(self.n_workers, num_threads=self.threads, schedule="dynamic"):
                self.worker_bad[w] = self.pull_worker_het(w, per_pair * self.worker_start[w]) \
                    if self.staleness >= 0 else self.pull_worker(w, per_pair * self.worker_start[w])
            for w in range(self.n_workers):
                if self.worker_bad[w] >= 0:
                    bad_worker = w
                    break
            if bad_worker < 0:
                for w in range(self.n_workers):
                    self.pull_span[2 * w] = per_pair * self.worker_start[w]
                    self.pull_span[2 * w + 1] = self.pull_span[2 * w] + self.worker_fill[w]
                    self.add_run(self.pull_span[2 * w], self.pull_span[2 * w + 1])
                self.update_base = per_pair * self.n_pairs
                if self.staleness >= 0:
                    self.update_het()
                else:
                    self.update()
                self.add_run(self.update_base, self.update_base + self.n_pairs)
                self.total_kinds()
                self.spans_valid = True
        if bad_worker < 0:
            if self.annotate:
                with nogil:
                    for w in prange(self.n_workers, num_threads=self.threads, schedule="dynamic"):
                        self.mark_writes(self.pull_span[2 * w], self.pull_span[2 * w + 1])
                        if self.staleness >= 0:  # else update() marked its writes by row
                            self.mark_writes(self.update_base + self.worker_start[w],
                                             self.update_base + self.worker_start[w + 1])
            with nogil:
                self.digest_events()
        if bad_worker >= 0:
            bad_row = self.worker_bad[bad_worker]
            raise StateError(f"row {bad_row}: needed by worker {bad_worker} but neither fresh there nor held by the PS"
                             if bad_row < self.n_rows else
                             f"worker {bad_worker}: cache of {self.capacity} slots cannot hold this iteration's "
                             f"working set; raise the cache size")
        self.needs_ready = False
        return self.counts()

    cdef inline int32_t source(self, int64_t p) noexcept nogil:
        """The worker sending pair ``p``'s row (P2P), or EMPTY: the PS."""
        return self.pair_source[p] if self.p2p else EMPTY

    cdef void match_p2p(self) noexcept nogil:
        """P2P: a row dirty on ``w`` and needed by one other worker ``v`` goes straight ``w`` -> ``v``.

        Decided for all workers before any of them evicts, so the sender's
        copy is still in its slot; from here on ``w`` and ``v`` both hold it
        (``w``'s copy is no longer dirty: evicting it needs no write-back).
        After plan(), a dirty row needed now has one trainer, so each pair
        sets the bit of a row no other pair touches.
        """
        cdef int64_t p, e
        cdef int owner, v
        for p in prange(self.n_pairs, num_threads=self.threads, schedule="static"):
            e = self.pair_row[p]
            v = self.pair_worker[p]
            owner = self.dirty_owner(e)
            if owner >= 0 and owner != v:
                self.pair_source[p] = owner
                self.pair_source_slot[p] = self.find(owner, e)
                self.set_bit(e, v + 1)

    cdef int64_t pull_worker(self, int w, int64_t n) noexcept nogil:
        """Step 2 for worker ``w``, its events from ``n`` on; returns -1, or the offending row
        (n_rows + x: cache too small). Its event count goes to ``worker_fill[w]``, by kind to ``worker_kinds``.

        Other workers' threads run at the same time. A pull sets no holder
        bit (the update writes every trained row's holders); an eviction
        clears this worker's bit (atomically: other workers evicting the
        row clear theirs). A victim whose only latest copy is here is needed
        by no other worker (it would have been pushed or matched peer to
        peer), so writing it back touches no row they use.
        """
        cdef int64_t p, e, victim, start = n, cbase = w * self.capacity
        cdef int64_t first = self.worker_start[w], last = self.worker_start[w + 1]
        cdef int64_t kinds[N_KINDS]  # counted here, added once: neighbours' counts share cache lines
        memset(kinds, 0, sizeof(kinds))
        cdef int32_t s
        if last - first > self.capacity:
            return self.n_rows
        self.find_slots(w, first, last)
        self.pin(w, first, last)
        for p in range(first, last):
            if p + AHEAD < last:
                prefetch(&self.holders[self.pair_row[p + AHEAD] * self.words])
            e = self.pair_row[p]
            if self.source(p) == EMPTY:
                if self.fresh(e, w):
                    continue
                if not self.has_bit(e, PS_BIT):
                    return e
            s = self.pair_slot[p]
            if s == EMPTY:
                s = self.free_or_victim(w)
                if s == EMPTY:
                    return self.n_rows
                victim = self.slot_row[cbase + s]
                if victim != EMPTY:
                    if self.dirty_owner(victim) == w:
                        self.record(n, K_WRITEBACK, w, victim, s, EMPTY)
                        n += 1
                        kinds[K_WRITEBACK] += 1
                        self.set_only(victim, PS_BIT)
                    else:
                        self.clear_bit(victim, w + 1)
                self.install(w, e, s)
                self.pair_slot[p] = s
            if self.source(p) == EMPTY:  # w now holds e fresh; settle_row writes e's holders after the update
                self.record(n, K_PULL, w, e, s, EMPTY)
                kinds[K_PULL] += 1
            else:
                self.record(n, K_P2P, w, e, s, EMPTY)
                self.ev_peer[n] = self.pair_source[p]
                self.ev_peer_slot[n] = self.pair_source_slot[p]
                kinds[K_P2P] += 1
            n += 1
        self.worker_fill[w] = n - start
        self.add_kinds(w, kinds)
        self.mark_prefetchable(start, n)
        return -1

    cdef void find_slots(self, int w, int64_t first, int64_t last) noexcept nogil:
        """``pair_slot`` of pairs ``[first, last)``: their rows' slots in ``w``'s cache, or EMPTY.

        Apart from the touches (a lookup changes nothing), so that each
        loop keeps its misses in flight: the map entries here, the
        replacement links in :meth:`pin`.
        """
        if last > first:
            self.find_many(&self.pair_row[first], NULL, w, &self.pair_slot[first], last - first)

    cdef void find_many(self, const int32_t* rows, const int16_t* workers, int w, int32_t* slots,
                        int64_t n) noexcept nogil:
        """``slots[k]``: the slot of ``rows[k]`` in the cache of ``workers[k]`` (of ``w`` where ``workers``
        is NULL), or EMPTY. Lookups run at memory latency, so each is split in three stages
        ``FAR_AHEAD`` apart: its table entries prefetched, then the slot its mark names (its row
        prefetched), then that row confirmed (the whole probe again where it is another row's)."""
        cdef int64_t k, ahead = FAR_AHEAD
        cdef int v
        cdef int32_t s
        for k in range(min(ahead, n)):
            slots[k] = self.tag_match(w if workers == NULL else workers[k], rows[k])
        for k in range(n):
            if k + 2 * ahead < n:
                v = w if workers == NULL else workers[k + 2 * ahead]
                prefetch(&self.table[v * self.table_size + self.home(rows[k + 2 * ahead])])
            if k + ahead < n:
                v = w if workers == NULL else workers[k + ahead]
                s = self.tag_match(v, rows[k + ahead])
                slots[k + ahead] = s
                if s != EMPTY:
                    prefetch(&self.slot_row[v * self.capacity + s])
            v = w if workers == NULL else workers[k]
            if slots[k] != EMPTY and self.slot_row[v * self.capacity + slots[k]] != rows[k]:
                slots[k] = self.find(v, rows[k])

    cdef void pin(self, int w, int64_t first, int64_t last) noexcept nogil:
        """Touch every cached row of pairs ``[first, last)`` in pair order, so the LRU tail holds only
        rows not needed now. Prefetches the links of the slot ``FAR_AHEAD`` pairs on, then those of its
        list neighbours ``FAR_AHEAD / 2`` pairs on (touches in between may move them: a prefetch is a
        hint)."""
        cdef int64_t p, b = w * self.capacity
        cdef int32_t s, n
        for p in range(first, last):
            if p + FAR_AHEAD < last:
                s = self.pair_slot[p + FAR_AHEAD]
                if s != EMPTY:
                    prefetch(self.link_address(2 * (b + s)))
            if p + FAR_AHEAD // 2 < last:
                s = self.pair_slot[p + FAR_AHEAD // 2]
                if s != EMPTY:
                    n = self.link(2 * (b + s))
                    if n != EMPTY:
                        prefetch(self.link_address(2 * (b + n)))
                    n = self.link(2 * (b + s) + 1)
                    if n != EMPTY:
                        prefetch(self.link_address(2 * (b + n)))
            s = self.pair_slot[p]
            if s != EMPTY:
                self.lru_touch(w, s)

    cdef void mark_prefetchable(self, int64_t start, int64_t end) noexcept nogil:
        """``ev_early`` of the pulls among events ``[start, end)``: rows the previous iteration did not
        write to the PS. A pass of its own, so that its lookups in the written set overlap."""
        cdef int64_t n
        cdef int64_t base = ((self.iteration - 1) & 1) * self.written_words
        if not self.annotate:
            return
        for n in range(start, end):
            if n + FAR_AHEAD < end:
                prefetch(&self.written[base + (self.ev_row[n + FAR_AHEAD] >> 6)])
            if self.ev_kind[n] == K_PULL:
                self.ev_early[n] = not self.written_before(self.ev_row[n])

    cdef void mark_writes(self, int64_t start, int64_t end) noexcept nogil:
        """Mark the rows that events ``[start, end)`` write to the PS (write-backs, Accumulates, pushes).
        A pass of its own, after the events: its misses overlap."""
        cdef int64_t n
        cdef int64_t base = (self.iteration & 1) * self.written_words
        cdef int kind
        for n in range(start, end):
            if n + FAR_AHEAD < end:
                prefetch(&self.written[base + (self.ev_row[n + FAR_AHEAD] >> 6)])
            kind = self.ev_kind[n]
            if kind != K_PULL and kind != K_LOCAL and kind != K_P2P and kind != K_VERSION_CHECK:
                self.mark_written(self.ev_row[n])

    cdef void update(self) noexcept nogil:
        """Step 4: who holds the latest value of each trained row after the update.

        One event per pair, at ``update_base`` + the pair's position, by
        worker in parallel; then each row's holders, by row in parallel.
        With ``annotate`` the rows the update writes to the PS are marked
        there too, once per row: its Accumulates (trainers >= 2) or, in
        full-set mode, its push (one per trainer event otherwise).
        """
        cdef int64_t n
        cdef int w, t
        for w in prange(self.n_workers, num_threads=self.threads, schedule="dynamic"):
            self.update_worker(w)
        for t in range(self.threads):
            self.thread_rounds[8 * t] = 0
        for n in prange(self.n_need, num_threads=self.threads, schedule="static"):
            self.settle_row(n)
            if self.annotate and self.need_rows[n] >= 0 and (self.full_set or self.need_trainers[n] >= 2):
                self.mark_written(self.need_rows[n])
            if self.need_trainers[n] >= 2 and self.need_trainers[n] > self.thread_rounds[8 * threadid()]:
                self.thread_rounds[8 * threadid()] = self.need_trainers[n]
        self.accumulate_rounds = 0
        for t in range(self.threads):
            self.accumulate_rounds = max(self.accumulate_rounds, <int>self.thread_rounds[8 * t])

    cdef void update_worker(self, int w) noexcept nogil:
        """Worker ``w``'s update events. An Accumulate's turn is the count of the row's trainers before
        ``w``: the runtime adds a row's contributions in worker order, bit-reproducibly (docs/design.md
        section 13)."""
        cdef int64_t p, n, need
        cdef int32_t pair
        cdef int64_t kinds[N_KINDS]  # counted here, added once: neighbours' counts share cache lines
        memset(kinds, 0, sizeof(kinds))
        cdef int64_t last = self.worker_start[w + 1]
        for p in range(self.worker_start[w], last):
            if p + FAR_AHEAD < last:  # a shared row's reads: its trainers, its record
                need = self.pair_need[p + FAR_AHEAD]
                prefetch(&self.need_trainers[need])
                prefetch(&self.need_masks[need * self.words])
            n = self.update_base + p
            pair = <int32_t>(p - self.worker_start[w])
            need = self.pair_need[p]
            if self.need_trainers[need] >= 2:
                self.record(n, K_ACCUMULATE, w, self.pair_row[p], self.pair_slot[p], pair)
                self.ev_turn[n] = <int16_t>self.trainers_before(need, w)
                kinds[K_ACCUMULATE] += 1
            elif self.full_set:
                self.record(n, K_FULL_SET_PUSH, w, self.pair_row[p], self.pair_slot[p], pair)
                kinds[K_FULL_SET_PUSH] += 1
            else:
                self.record(n, K_LOCAL, w, self.pair_row[p], self.pair_slot[p], pair)
                kinds[K_LOCAL] += 1
        self.add_kinds(w, kinds)

    cdef inline int32_t trainers_before(self, int64_t need, int w) noexcept nogil:
        """Workers below ``w`` that need row ``need`` (its need record's bits below ``w + 1``)."""
        cdef int bit = w + 1, k
        cdef int32_t count = 0
        for k in range(bit >> 6):
            count += popcount64(self.need_masks[need * self.words + k])
        return count + popcount64(self.need_masks[need * self.words + (bit >> 6)]
                                  & (((<uint64_t>1) << (bit & 63)) - 1))

    cdef void settle_row(self, int64_t need) noexcept nogil:
        """``L(e)`` of a trained row: the PS if several workers trained it (Accumulate), else its trainer
        (and the PS too in full-set mode)."""
        cdef int64_t e = self.need_rows[need], k
        cdef uint64_t x
        if e < 0:  # an index no row took
            return
        if self.need_trainers[need] >= 2:
            self.set_only(e, PS_BIT)
            return
        for k in range(self.words):
            x = self.need_masks[need * self.words + k]
            self.holders[e * self.words + k] = x | (1 if k == 0 and self.full_set else 0)

    # -------------------------------------------------------------------- HET
    cdef int64_t pull_worker_het(self, int w, int64_t n) noexcept nogil:
        """HET's read for worker ``w`` (docs/design.md section 7); returns as :meth:`pull_worker`.

        A cached row costs a version check; it is refetched when the PS has
        more than ``staleness`` updates it has not seen (its own unpushed
        updates stay: the runtime adds them to the fetched value, and they
        are pushed with this iteration's update). A row not cached is
        fetched into a free or evicted slot; an evicted row's unpushed
        updates are pushed (``delta_writeback``). Versions read here are
        those at the start of the iteration: every push of an iteration
        lands after every read of it (docs/design.md section 11).
        """
        cdef int64_t p, e, start = n, cbase = w * self.capacity
        cdef int64_t first = self.worker_start[w], last = self.worker_start[w + 1]
        cdef int64_t kinds[N_KINDS]  # counted here, added once: neighbours' counts share cache lines
        memset(kinds, 0, sizeof(kinds))
        cdef int32_t s
        if last - first > self.capacity:
            return self.n_rows
        self.find_slots(w, first, last)
        self.pin(w, first, last)
        for p in range(first, last):
            self.pair_sync[p] = 0
        for p in range(first, last):
            e = self.pair_row[p]
            s = self.pair_slot[p]
            if s != EMPTY:
                self.record(n, K_VERSION_CHECK, w, e, s, EMPTY)
                self.ev_value[n] = self.version[e]
                n += 1
                kinds[K_VERSION_CHECK] += 1
                if self.version[e] - self.slot_seen[cbase + s] <= self.staleness:
                    continue
                self.pair_sync[p] = self.slot_pending[cbase + s] > 0
            else:
                s = self.free_or_victim(w)
                if s == EMPTY:
                    return self.n_rows
                if self.slot_pending[cbase + s] > 0:  # only a victim's slot holds updates
                    self.record(n, K_DELTA_WRITEBACK, w, self.slot_row[cbase + s], s, EMPTY)
                    self.ev_value[n] = self.slot_pending[cbase + s]
                    n += 1
                    kinds[K_DELTA_WRITEBACK] += 1
                    self.slot_pending[cbase + s] = 0
                self.install(w, e, s)
                self.pair_slot[p] = s
            self.record(n, K_PULL, w, e, s, EMPTY)
            n += 1
            kinds[K_PULL] += 1
            self.slot_seen[cbase + s] = self.version[e]
        self.worker_fill[w] = n - start
        self.add_kinds(w, kinds)
        self.mark_prefetchable(start, n)
        return -1

    cdef void update_het(self) noexcept nogil:
        """HET's write: every trainer updates its cached copy; it pushes the updates it has not pushed
        once they exceed ``staleness`` (or when the row was refetched with some), else keeps them.

        ``staleness = 0`` pushes every update in its iteration and refetches
        every row another worker pushed: BSP. The pushes' updates reach the
        versions after every worker's reads (:meth:`publish_versions`).
        """
        cdef int w
        self.accumulate_rounds = 0
        for w in prange(self.n_workers, num_threads=self.threads, schedule="dynamic"):
            self.update_worker_het(w)  # reads no version: publishing as workers finish is safe
            self.publish_versions(self.pull_span[2 * w], self.pull_span[2 * w + 1])
            self.publish_versions(self.update_base + self.worker_start[w], self.update_base + self.worker_start[w + 1])

    cdef void update_worker_het(self, int w) noexcept nogil:
        """Worker ``w``'s HET updates (its own slots' clocks): one event per pair at ``update_base`` + the pair."""
        cdef int64_t p, k, n
        cdef int64_t kinds[N_KINDS]  # counted here, added once: neighbours' counts share cache lines
        memset(kinds, 0, sizeof(kinds))
        for p in range(self.worker_start[w], self.worker_start[w + 1]):
            n = self.update_base + p
            k = w * self.capacity + self.pair_slot[p]
            self.slot_pending[k] += 1
            if self.slot_pending[k] > self.staleness or self.pair_sync[p]:
                self.record(n, K_DELTA_PUSH, w, self.pair_row[p], self.pair_slot[p],
                            <int32_t>(p - self.worker_start[w]))
                self.ev_turn[n] = 0
                self.ev_value[n] = self.slot_pending[k]
                kinds[K_DELTA_PUSH] += 1
                self.slot_seen[k] += self.slot_pending[k]
                self.slot_pending[k] = 0
            else:
                self.record(n, K_LOCAL, w, self.pair_row[p], self.pair_slot[p], <int32_t>(p - self.worker_start[w]))
                kinds[K_LOCAL] += 1
        self.add_kinds(w, kinds)

    cdef void publish_versions(self, int64_t start, int64_t end) noexcept nogil:
        """The PS versions count the updates pushed by events ``[start, end)`` (workers' threads add at once)."""
        cdef int64_t i
        for i in range(start, end):
            if self.ev_kind[i] == K_DELTA_PUSH or self.ev_kind[i] == K_DELTA_WRITEBACK:
                fetch_add_i64(&self.version[self.ev_row[i]], self.ev_value[i])

    def flush_pending(self):
        """HET: push every worker's unpushed updates (at the end of training, before reading the model).

        Returns (worker, row, slot, count) arrays by worker and slot; the
        versions count them afterwards. Scans the caches: called once, not
        per iteration.
        """
        if self.staleness < 0:
            raise StateError("flush_pending() is HET's; other modes flush dirty rows (flush_dirty)")
        pending = np.asarray(self.slot_pending).reshape(self.n_workers, self.capacity)
        workers_array, slots_array = np.nonzero(pending > 0)
        rows_array = np.asarray(self.slot_row).reshape(self.n_workers, self.capacity)[workers_array, slots_array]
        counts_array = pending[workers_array, slots_array].astype(np.int64)
        np.add.at(np.asarray(self.version), rows_array.astype(np.int64), counts_array)
        seen = np.asarray(self.slot_seen).reshape(self.n_workers, self.capacity)
        seen[workers_array, slots_array] += counts_array
        pending[workers_array, slots_array] = 0
        return (workers_array.astype(np.int32), rows_array.astype(np.int64), slots_array.astype(np.int32),
                counts_array)

    def seen_everything(self, int w):
        """HET: (rows, slots) of ``w``'s cached rows that have seen every update the PS holds and hold none
        it lacks: their cached values must equal the PS's (a check, not per iteration: it scans the cache)."""
        if self.staleness < 0:
            raise StateError("seen_everything() is HET's")
        if w < 0 or w >= self.n_workers:
            raise ValueError(f"worker must be in [0, {self.n_workers}), got {w}")
        base = w * self.capacity
        rows = np.asarray(self.slot_row[base:base + self.used[w * LINE]]).astype(np.int64)
        seen = np.asarray(self.slot_seen[base:base + self.used[w * LINE]])
        pending = np.asarray(self.slot_pending[base:base + self.used[w * LINE]])
        slots = np.flatnonzero((rows >= 0) & (pending == 0))
        slots = slots[np.asarray(self.version)[rows[slots]] == seen[slots]]
        return rows[slots], slots.astype(np.int32)

    def versions(self):
        """HET: the PS version (updates pushed) of every row, a copy."""
        return np.asarray(self.version).copy()

    # ------------------------------------------------------------------- plan
    def plan(self, rows_next=None, alloc_next=None):
        """Set the needs of ``t + 1`` and push what they require (step 5). Returns event counts.

        Without a next batch (the last iteration) nothing is planned. In
        full-set mode no row is ever dirty, so the plan is always empty.
        """
        cdef int64_t c, k, chunks, total = 0
        self.start_events()
        self.needs_seconds = 0.0
        if rows_next is None:
            self.needs_ready = False
            with nogil:
                self.digest_events()
            return self.counts()
        start = time.perf_counter()
        self.set_needs(rows_next, alloc_next)
        self.needs_seconds = time.perf_counter() - start
        chunks = min(self.chunk_fill.shape[0] - 1, max(1, self.n_pairs // 256))  # so threads share small batches too
        with nogil:
            for k in prange(self.n_need, num_threads=self.threads, schedule="static"):
                self.need_pusher[k] = self.pusher(k)
            for c in prange(chunks, num_threads=self.threads, schedule="static"):
                self.chunk_fill[c] = self.find_pushes(c * self.n_pairs // chunks, (c + 1) * self.n_pairs // chunks)
            for c in range(chunks):
                total += self.chunk_fill[c]
                self.chunk_fill[c] = total - self.chunk_fill[c]
        with nogil:
            for c in prange(chunks, num_threads=self.threads, schedule="static"):
                self.record_pushes(c * self.n_pairs // chunks, (c + 1) * self.n_pairs // chunks, self.chunk_fill[c])
            self.add_run(0, total)
            self.kind_total[K_PLAN_PUSH] = total
            self.digest_events()
        return self.counts()

    cdef int32_t pusher(self, int64_t need) noexcept nogil:
        """The worker whose pair pushes row ``need`` in the plan, or EMPTY.

        A row dirty on ``owner`` and needed by another worker is pushed
        once, by the pair of the lowest such worker, the first in pair order
        (then the PS holds it); in P2P mode a row one worker needs is sent
        peer to peer instead. Decided per row, not per pair: a batch's rows
        are needed by 12 pairs each on average (128 workers, Criteo-like),
        and each decision reads the row's holders.
        """
        cdef int64_t e = self.need_rows[need]
        cdef int owner
        if e < 0 or (self.p2p and self.need_trainers[need] == 1):
            return EMPTY
        owner = self.dirty_owner(e)
        return EMPTY if owner < 0 else self.first_trainer_but(need, owner)

    cdef int64_t find_pushes(self, int64_t first, int64_t last) noexcept nogil:
        """Which of pairs ``[first, last)`` make a plan push (:meth:`pusher`): ``tmp_need[p]`` the pushing
        owner, or EMPTY. Reads the holders only, so chunks of pairs run in parallel."""
        cdef int64_t p, count = 0
        for p in range(first, last):
            self.tmp_need[p] = EMPTY
            if self.need_pusher[self.pair_need[p]] == self.pair_worker[p]:
                self.tmp_need[p] = self.dirty_owner(self.pair_row[p])
                count += 1
        return count

    cdef inline int first_trainer_but(self, int64_t need, int owner) noexcept nogil:
        """The lowest worker other than ``owner`` that needs row ``need`` (-1: none)."""
        cdef int k, bit
        cdef uint64_t x
        for k in range(self.words):
            x = self.need_masks[need * self.words + k]
            while x:
                bit = 64 * k + ctz64(x)
                if bit - 1 != owner:
                    return bit - 1
                x = x & (x - 1)
        return -1

    cdef void record_pushes(self, int64_t first, int64_t last, int64_t n) noexcept nogil:
        """The plan pushes :meth:`find_pushes` chose among pairs ``[first, last)``, as events from ``n`` on."""
        cdef int64_t p, e, start = n
        cdef int owner
        for p in range(first, last):
            owner = self.tmp_need[p]
            if owner == EMPTY:
                continue
            e = self.pair_row[p]
            self.record(n, K_PLAN_PUSH, owner, e, EMPTY, EMPTY)
            self.set_bit(e, PS_BIT)
            if self.annotate:
                self.mark_written(e)
            n += 1
        if n > start:  # the owners' slots of the rows they push, looked up together
            self.find_many(&self.ev_row[start], &self.ev_worker[start], -1, &self.ev_slot[start], n - start)

    # ------------------------------------------------------------- flushing
    def flush_dirty(self):
        """Give every dirty row to the PS too (before evaluation or a checkpoint).

        Returns (worker, row, slot) arrays of the rows each worker must write
        back, by worker and slot; afterwards the PS holds the latest value of
        every row. Only cached rows can be dirty, so this scans the caches.
        """
        parts = [self.dirty_slots(w) for w in range(self.n_workers)]
        workers_array = np.repeat(np.arange(self.n_workers, dtype=np.int32), [len(p[0]) for p in parts])
        rows_array = np.concatenate([p[0] for p in parts])
        slots_array = np.concatenate([p[1] for p in parts])
        cdef int64_t[::1] rows = rows_array
        cdef int64_t k
        with nogil:
            for k in range(rows.shape[0]):
                self.set_bit(rows[k], PS_BIT)
        return workers_array, rows_array, slots_array

    def reset_to_ps(self, rows):
        """The PS alone holds the latest value of ``rows`` (FAE: the replicas were written to it).

        Cached copies stay in their slots but are no longer fresh, so the
        next iteration that needs them reads them again. Called at FAE's
        strip switches, not per iteration: it costs the rows given.
        """
        if self.full_set is False or self.staleness >= 0:
            raise StateError("reset_to_ps() is for full-set synchronization (FAE's cold strips): "
                             "no row may be dirty on a worker")
        cdef int64_t[::1] view = np.ascontiguousarray(rows, dtype=np.int64)
        if view.shape[0] and (np.asarray(view).min() < 0 or np.asarray(view).max() >= self.n_rows):
            raise ValueError(f"rows must be in [0, {self.n_rows})")
        cdef int64_t k
        with nogil:
            for k in range(view.shape[0]):
                self.set_only(view[k], PS_BIT)

    def dirty_slots(self, int w):
        """(rows, slots) of worker ``w``'s dirty rows, without changing the state.

        A checkpoint or a mid-run evaluation writes copies of them to the PS;
        the schedule must go on exactly as if nothing had been written, so
        their holder sets stay as they are (docs/design.md section 13).
        Scans the worker's cache: called at checkpoints, not per iteration.
        """
        if w < 0 or w >= self.n_workers:
            raise ValueError(f"worker must be in [0, {self.n_workers}), got {w}")
        cdef int64_t s, n = 0
        cdef int32_t e
        with nogil:
            for s in range(self.used[w * LINE]):
                e = self.slot_row[w * self.capacity + s]
                if e != EMPTY and self.dirty_owner(e) == w:
                    n += 1
        rows_array = np.empty(n, dtype=np.int64)
        slots_array = np.empty(n, dtype=np.int32)
        cdef int64_t[::1] rows = rows_array
        cdef int32_t[::1] slots = slots_array
        n = 0
        with nogil:
            for s in range(self.used[w * LINE]):
                e = self.slot_row[w * self.capacity + s]
                if e != EMPTY and self.dirty_owner(e) == w:
                    rows[n], slots[n] = e, <int32_t>s
                    n += 1
        return rows_array, slots_array

    # ------------------------------------------------------------ saving
    def _links(self):
        """The replacement links as int32 (more recent, less recent) copies, EMPTY for none: how they are
        saved and digested, whichever width the state keeps."""
        if self.narrow:
            links = np.asarray(self.lru_links16).astype(np.int32)
            links[links == NARROW_EMPTY] = EMPTY
        else:
            links = np.asarray(self.lru_links).copy()
        return links[0::2].copy(), links[1::2].copy()

    def _set_links(self, more_recent, less_recent):
        """Restore the replacement links from their int32 form (:meth:`_links`) into the width kept."""
        links = np.empty(2 * len(more_recent), dtype=np.int32)
        links[0::2], links[1::2] = more_recent, less_recent
        if self.narrow:
            np.asarray(self.lru_links16)[:] = links.astype(np.uint16)  # EMPTY wraps to NARROW_EMPTY
        else:
            np.asarray(self.lru_links)[:] = links

    def _persistent(self):
        """Views of the arrays that outlive an iteration, by name (the replacement links: :meth:`_links`). The
        per worker fields are [workers, fields] views past their padding: saved and hashed, they read as before."""
        return {"holders": np.asarray(self.holders), "slot_row": np.asarray(self.slot_row),
                "lru_head": self._per_worker(self.lru_head, self.buckets),
                "lru_tail": self._per_worker(self.lru_tail, self.buckets),
                "freq": np.asarray(self.freq), "lowest": self._per_worker(self.lowest, 1),
                "used": self._per_worker(self.used, 1)}

    def _per_worker(self, array, int width):
        """The first ``width`` fields of each worker's padded stretch of ``array``, as a [workers, width] view."""
        return np.asarray(array).reshape(self.n_workers, -1)[:, :width]

    def _shape_scalars(self):
        return [self.n_workers, self.n_rows, self.capacity, self.buckets, self.max_pairs, self.full_set, self.p2p]

    def memory_parts(self):
        """Bytes of the state's arrays by what they hold (``hybrid bench scheduler``'s memory by part).

        Per row: the holder sets; per cache slot of every worker: the caches
        (slot rows, replacement links) and the row-to-slot tables, and HET's
        versions; per (row, worker) need of a global batch: the needs, the
        pairs and the event records, sized for the largest batch.
        """
        return {
            "holder sets": self.holders.nbytes,
            "caches": (self.slot_row.nbytes + self.lru_links16.nbytes + self.lru_links.nbytes + self.lru_head.nbytes +
                       self.lru_tail.nbytes +
                        self.freq.nbytes + self.lowest.nbytes + self.used.nbytes),
            "row-to-slot tables": self.table.nbytes,
            "HET versions": (self.version.nbytes + self.slot_seen.nbytes + self.slot_pending.nbytes +
                              self.pair_sync.nbytes),
            "needs": (self.need_table.nbytes + self.need_claim.nbytes + self.need_rows.nbytes +
                       self.need_masks.nbytes + self.need_trainers.nbytes + self.need_pusher.nbytes +
                       self.need_focus.nbytes + self.need_seen.nbytes + self.seen_stamp.nbytes),
            "pairs": (self.pair_row.nbytes + self.pair_worker.nbytes + self.pair_slot.nbytes +
                       self.pair_need.nbytes + self.pair_source.nbytes + self.pair_source_slot.nbytes +
                       self.tmp_row.nbytes + self.tmp_need.nbytes + self.sample_order.nbytes +
                       self.sample_start.nbytes + self.focus_sample.nbytes + self.focus_entry.nbytes +
                       self.worker_fill.nbytes + self.worker_start.nbytes + self.worker_kinds.nbytes +
                       self.worker_bad.nbytes + self.chunk_fill.nbytes),
            "written bitmaps": (self.written.nbytes + self.written_set.nbytes + self.written_fill.nbytes),
            "events": (self.ev_row.nbytes + self.ev_worker.nbytes + self.ev_slot.nbytes + self.ev_kind.nbytes +
                        self.ev_peer.nbytes + self.ev_peer_slot.nbytes + self.ev_pair.nbytes +
                        self.ev_early.nbytes + self.ev_turn.nbytes + self.ev_value.nbytes +
                        self.kind_total.nbytes + self.pull_span.nbytes + self.runs.nbytes + self.span_ends.nbytes +
                        self.span_hash.nbytes),
        }

    def save_arrays(self):
        """The state that outlives an iteration, as NumPy arrays (copies), for a checkpoint.

        Taken between ``plan(t)`` and ``train(t + 1)``. The needs of ``t + 1``
        are left out: :meth:`load_arrays` is followed by ``set_needs`` with the
        saved allocation, which rebuilds them (and the focus worker's index)
        for whichever worker loads the state.
        """
        if self.staleness >= 0:
            raise StateError("HET's clocks and unpushed updates are not checkpointed (docs/design.md section 7)")
        arrays = {name: np.array(view).reshape(-1) for name, view in self._persistent().items()}
        arrays["lru_prev"], arrays["lru_next"] = self._links()
        arrays["written_rows"] = self.written_rows(self.iteration)
        arrays["scalars"] = np.array([self.iteration, self.epoch, *self._shape_scalars()], dtype=np.int64)
        return arrays

    def load_arrays(self, arrays):
        """Restore what :meth:`save_arrays` returned; refuses a state of another shape or policy."""
        scalars = np.asarray(arrays["scalars"], dtype=np.int64)
        expected = self._shape_scalars()
        if len(scalars) != 2 + len(expected) or list(scalars[2:]) != expected:
            raise ValueError(f"saved cluster state has (workers, rows, slots, buckets, max pairs, full set, p2p) = "
                             f"{tuple(int(x) for x in scalars[2:])}, this one {tuple(expected)}")
        mine = self._persistent()
        written = saved_written_rows(arrays, scalars[0], self.n_rows)
        links = np.empty(self.n_workers * self.capacity, dtype=np.int32)  # their saved form (_links)
        for name, view in (*mine.items(), ("lru_prev", links), ("lru_next", links)):
            saved = np.asarray(arrays[name])
            if saved.shape != (view.size,) or saved.dtype != view.dtype:
                raise ValueError(f"saved cluster state array {name} is {saved.shape} {saved.dtype}, "
                                 f"expected {(view.size,)} {view.dtype}")
        self._check_loaded(arrays)
        for name, view in mine.items():
            view[...] = np.asarray(arrays[name]).reshape(view.shape)
        self._set_links(np.asarray(arrays["lru_prev"]), np.asarray(arrays["lru_next"]))
        with nogil:
            self.map_rebuild()
        self.iteration, self.epoch = scalars[0], <int32_t>scalars[1]
        self.set_written(written)
        self.needs_ready = False

    def written_rows(self, int64_t iteration):
        """The rows ``iteration`` (the current or the previous one) wrote to the PS, sorted."""
        if iteration != self.iteration and iteration != self.iteration - 1:
            raise ValueError(f"the written rows of iterations {self.iteration - 1} and {self.iteration} are kept, "
                             f"not of {iteration}")
        h = iteration & 1
        words = np.asarray(self.written)[h * self.written_words:(h + 1) * self.written_words]
        return np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little")).astype(np.int64)

    def set_written(self, const int64_t[::1] rows):
        """Make ``rows`` (in [0, n_rows)) the current iteration's written rows, and the previous one's none."""
        cdef int64_t k
        with nogil:
            self.clear_written(self.iteration)
            self.clear_written(self.iteration - 1)
            for k in range(rows.shape[0]):
                self.mark_written(rows[k])

    def _check_loaded(self, arrays):
        """Values the kernels index with (compiled without bounds checks) must be in range."""
        slot_row = np.asarray(arrays["slot_row"])
        if ((slot_row < EMPTY) | (slot_row >= self.n_rows)).any():
            raise ValueError("saved cluster state has cache rows outside the table")
        for name in ("lru_prev", "lru_next", "lru_head", "lru_tail"):
            links = np.asarray(arrays[name])
            if ((links < EMPTY) | (links >= self.capacity)).any():
                raise ValueError(f"saved cluster state has {name} links outside the cache")
        used, lowest = np.asarray(arrays["used"]), np.asarray(arrays["lowest"])
        if ((used < 0) | (used > self.capacity)).any() or ((lowest < 0) | (lowest >= self.buckets)).any():
            raise ValueError("saved cluster state has cache fill counts out of range")
        freq = np.asarray(arrays["freq"])
        if ((freq < 0) | (freq >= self.buckets)).any():
            raise ValueError("saved cluster state has LFU buckets out of range")
        spare = self.words * 64 - (self.n_workers + 1)  # holder bits past the last worker must be clear
        if spare:
            last = np.asarray(arrays["holders"]).reshape(self.n_rows, self.words)[:, -1]
            if (last >> np.uint64(64 - spare)).any():
                raise ValueError("saved cluster state has holder bits of workers that do not exist")

    # ------------------------------------------------------------ copying
    def copy(self):
        """An independent state with the same contents (for what-if evaluation)."""
        cdef ClusterState clone = ClusterState(
            n_workers=self.n_workers, n_rows=self.n_rows, capacity=self.capacity, full_set=self.full_set,
            max_pairs=self.max_pairs, p2p=self.p2p, policy="lru" if self.buckets == 1 else "lfu", focus=self.focus,
            annotate=self.annotate, staleness=self.staleness, threads=self.threads, distance_bits=self.distance_bits)
        clone.written[:] = self.written
        clone.written_set[:] = self.written_set
        clone.written_fill[:] = self.written_fill
        theirs = clone._persistent()
        for name, view in self._persistent().items():
            theirs[name][:] = view
        clone.table[:] = self.table
        clone.lru_links16[:] = self.lru_links16
        clone.lru_links[:] = self.lru_links
        clone.size_needs(self.need_bits)
        clone.need_table[:] = self.need_table
        clone.need_rows[:] = self.need_rows
        clone.need_masks[:] = self.need_masks
        clone.pair_row[:] = self.pair_row
        clone.pair_worker[:] = self.pair_worker
        clone.pair_slot[:] = self.pair_slot
        clone.pair_need[:] = self.pair_need
        clone.pair_source[:] = self.pair_source
        clone.pair_source_slot[:] = self.pair_source_slot
        clone.need_trainers[:] = self.need_trainers
        clone.version[:] = self.version
        clone.slot_seen[:] = self.slot_seen
        clone.slot_pending[:] = self.slot_pending
        clone.worker_start[:] = self.worker_start
        clone.need_focus[:] = self.need_focus
        clone.focus_sample = np.asarray(self.focus_sample).copy()
        clone.focus_entry = np.asarray(self.focus_entry).copy()
        clone.epoch, clone.n_need, clone.n_pairs = self.epoch, self.n_need, self.n_pairs
        clone.needs_ready, clone.n_tables, clone.n_focus = self.needs_ready, self.n_tables, self.n_focus
        clone.accumulate_rounds = self.accumulate_rounds
        clone.iteration = self.iteration
        return clone

    # ------------------------------------------------------------ inspection
    def holder_words(self):
        """The raw holder bitsets, a live view [n_rows * words] (bit w + 1 = worker w): LAIA scores from it."""
        return np.asarray(self.holders)

    def counts(self):
        """Events of the last train()/plan() call by kind name."""
        return dict(zip(KIND_NAMES, (int(x) for x in self.kind_total)))

    def worker_transmissions(self):
        """Transmissions of the last train()/plan() call per worker: its pulls, pushes and received P2P rows.

        The slowest worker sets an iteration's pace, so the busiest worker's
        count is what a balanced allocation lowers (the simulator sums it).
        """
        out = np.zeros(self.n_workers, dtype=np.int64)
        cdef int64_t[::1] per = out
        cdef int64_t k, r
        cdef int32_t kind
        cdef int w
        with nogil:
            if self.spans_valid:  # after train(): from each worker's counts by kind, not its events
                for w in range(self.n_workers):
                    for kind in range(N_KINDS):
                        if transmits(kind):
                            per[w] += self.worker_kinds[w * N_KINDS + kind]
            else:  # after plan(): its pushes (no counts per worker)
                for r in range(self.n_runs):
                    for k in range(self.runs[2 * r], self.runs[2 * r + 1]):
                        kind = self.ev_kind[k]
                        if transmits(kind):
                            per[self.ev_worker[k]] += 1
        return out

    def _in_order(self, array):
        """The last call's events of one field, its runs joined (a copy)."""
        values = np.asarray(array)
        return np.concatenate([values[self.runs[2 * r]:self.runs[2 * r + 1]] for r in range(self.n_runs)]
                              or [values[:0]])

    def events(self):
        """Events of the last call as arrays kind, worker, row, slot (in execution order)."""
        return (self._in_order(self.ev_kind).astype(np.int32), self._in_order(self.ev_worker).astype(np.int32),
                self._in_order(self.ev_row).astype(np.int64), self._in_order(self.ev_slot))

    def peers(self):
        """For the events of the last call: sending worker and its slot of P2P events, else -1."""
        kinds = self._in_order(self.ev_kind)
        if not self.p2p:  # no P2P events, and no peer fields kept
            return np.full(len(kinds), EMPTY, dtype=np.int32), np.full(len(kinds), EMPTY, dtype=np.int32)
        p2p = kinds == K_P2P
        return np.where(p2p, self._in_order(self.ev_peer), EMPTY), np.where(p2p, self._in_order(self.ev_peer_slot), EMPTY)

    def prefetchable(self):
        """For the events of the last call: pulls of rows the previous iteration did not write to the PS."""
        return (self._in_order(self.ev_early) != 0) & (self._in_order(self.ev_kind) == K_PULL)

    def p2p_sends(self, int w):
        """The P2P rows worker ``w`` sends after ``train()``: each receiver's, in the receiver's event order.

        A dict of arrays: ``receivers``, ``rows``, ``slots`` (``w``'s slots,
        where the rows are) and ``receiver_slots``. Both sides walk the same
        events, so the rows ``w`` packs for ``v`` come in the order ``v``
        lists them: no ids or slots travel with the values.
        """
        if w < 0 or w >= self.n_workers:
            raise ValueError(f"worker must be in [0, {self.n_workers}), got {w}")
        if not self.spans_valid:
            raise StateError("p2p_sends() reads the events of train(); call it before plan()")
        cdef int64_t i, k = 0, n = 0
        cdef int v
        with nogil:
            for v in range(self.n_workers):
                for i in range(self.pull_span[2 * v], self.pull_span[2 * v + 1]):
                    if self.ev_kind[i] == K_P2P and self.ev_peer[i] == w:
                        n += 1
        receivers_array, rows_array = np.empty(n, dtype=np.int32), np.empty(n, dtype=np.int64)
        slots_array, receiver_slots_array = np.empty(n, dtype=np.int32), np.empty(n, dtype=np.int32)
        cdef int32_t[::1] receivers = receivers_array, slots = slots_array, receiver_slots = receiver_slots_array
        cdef int64_t[::1] rows = rows_array
        with nogil:
            for v in range(self.n_workers):
                for i in range(self.pull_span[2 * v], self.pull_span[2 * v + 1]):
                    if self.ev_kind[i] == K_P2P and self.ev_peer[i] == w:
                        receivers[k], rows[k] = v, self.ev_row[i]
                        slots[k], receiver_slots[k] = self.ev_peer_slot[i], self.ev_slot[i]
                        k += 1
        return {"receivers": receivers_array, "rows": rows_array, "slots": slots_array,
                "receiver_slots": receiver_slots_array}

    def worker_events(self, int w):
        """Worker ``w``'s events of the last call by kind name, each kind's in execution order.

        Per kind a dict of arrays: ``rows``, ``slots``; pulls add ``early``
        (prefetchable), updates ``pairs`` (positions among ``w``'s needed
        rows), Accumulates ``turns`` (workers before ``w`` that train the
        row), P2P ``peers`` and ``peer_slots``, version checks ``versions`` (expected
        at the PS), HET's pushes ``counts`` (the updates each carries). After ``train()`` only ``w``'s
        own runs of events are read; after ``plan()`` (plan pushes only) all.
        """
        if w < 0 or w >= self.n_workers:
            raise ValueError(f"worker must be in [0, {self.n_workers}), got {w}")
        cdef int64_t i, k, r
        cdef bint het = self.staleness >= 0  # event values are kept for HET only
        cdef int64_t[::1] start = np.zeros(N_KINDS + 1, dtype=np.int64)
        cdef int64_t[::1] runs = np.zeros(4, dtype=np.int64)
        if self.spans_valid:
            runs[0], runs[1] = self.pull_span[2 * w], self.pull_span[2 * w + 1]
            runs[2], runs[3] = self.update_base + self.worker_start[w], self.update_base + self.worker_start[w + 1]
        else:
            runs[1] = self.n_events
        with nogil:
            for r in range(0, 4, 2):
                for i in range(runs[r], runs[r + 1]):
                    if self.ev_worker[i] == w:
                        start[self.ev_kind[i] + 1] += 1
            for k in range(N_KINDS):
                start[k + 1] += start[k]
        n = start[N_KINDS]
        rows_array, slots_array = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int32)
        aux_array, aux2_array = np.empty(n, dtype=np.int32), np.empty(n, dtype=np.int32)
        early_array, values_array = np.empty(n, dtype=np.int8), np.empty(n, dtype=np.int64)
        cdef int64_t[::1] rows = rows_array, values = values_array
        cdef int32_t[::1] slots = slots_array, aux = aux_array, aux2 = aux2_array
        cdef int8_t[::1] early = early_array
        cdef int64_t[::1] fill = np.asarray(start).copy()
        with nogil:
            for r in range(0, 4, 2):
                for i in range(runs[r], runs[r + 1]):
                    if self.ev_worker[i] != w:
                        continue
                    k = fill[self.ev_kind[i]]
                    fill[self.ev_kind[i]] = k + 1
                    rows[k], slots[k], early[k] = self.ev_row[i], self.ev_slot[i], self.ev_early[i]
                    values[k] = self.ev_value[i] if het else 0
                    aux[k] = self.ev_peer[i] if self.ev_kind[i] == K_P2P else self.ev_pair[i]
                    aux2[k] = self.ev_turn[i] if self.ev_kind[i] == K_ACCUMULATE else \
                        (self.ev_peer_slot[i] if self.ev_kind[i] == K_P2P else EMPTY)
        result = {}
        for k in range(N_KINDS):
            a, b = start[k], start[k + 1]
            group = {"rows": rows_array[a:b], "slots": slots_array[a:b]}
            if k == K_PULL:
                group["early"] = early_array[a:b].astype(bool)
            elif k == K_LOCAL or k == K_ACCUMULATE or k == K_FULL_SET_PUSH or k == K_DELTA_PUSH:
                group["pairs"] = aux_array[a:b]
                if k == K_ACCUMULATE:
                    group["turns"] = aux2_array[a:b]
            elif k == K_P2P:
                group["peers"], group["peer_slots"] = aux_array[a:b], aux2_array[a:b]
            if k == K_VERSION_CHECK:
                group["versions"] = values_array[a:b]
            elif k == K_DELTA_PUSH or k == K_DELTA_WRITEBACK:
                group["counts"] = values_array[a:b]
            result[KIND_NAMES[k]] = group
        return result

    def focus_needs(self):
        """The focus worker's part of the current needs, as copies.

        ``samples`` (int64, positions in the batch), ``index`` (int32
        [samples, tables]: each sample's rows as positions in ``rows``),
        ``rows`` (int64, its distinct rows) and ``slots`` (int32, their cache
        slots: valid once ``train()`` has placed them).
        """
        if self.focus < 0:
            raise StateError("focus_needs() needs a focus worker (ClusterState(focus=w))")
        cdef int64_t a = self.worker_start[self.focus], b = self.worker_start[self.focus + 1]
        n, t = self.n_focus, self.n_tables
        return (np.asarray(self.focus_sample[:n]).copy(),
                np.asarray(self.focus_entry[:n * t]).reshape(n, t).copy(),
                np.asarray(self.pair_row[a:b]).astype(np.int64), np.asarray(self.pair_slot[a:b]).copy())

    def holder_sets(self):
        """``L(e)`` of every row as a bool array [n_rows, 1 + n_workers] (column 0 = PS)."""
        words = np.asarray(self.holders).reshape(self.n_rows, self.words)
        bits = np.unpackbits(words.view(np.uint8).reshape(self.n_rows, -1), axis=1, bitorder="little")
        return bits[:, :1 + self.n_workers].astype(bool)

    def cache_rows(self, int w):
        """Rows in worker ``w``'s cache by slot (-1 = free slot)."""
        return np.asarray(self.slot_row[w * self.capacity:(w + 1) * self.capacity]).copy()

    def rows_at_slots(self, positions):
        """Rows in the given cache slots of all workers (``w * capacity + slot``; -1 = free slot)."""
        positions = np.asarray(positions, dtype=np.int64)
        if len(positions) and (positions.min() < 0 or positions.max() >= self.n_workers * self.capacity):
            raise ValueError(f"slot positions must be in [0, {self.n_workers * self.capacity})")
        return np.asarray(self.slot_row)[positions].astype(np.int64)

    def slot_of(self, int w, int64_t row):
        """Slot of ``row`` in worker ``w``'s cache, or -1."""
        return self.find(w, row)

    def lru_order(self, int w):
        """Slots of worker ``w`` from last to first to be evicted (LFU: highest bucket first)."""
        order = []
        cdef int32_t s, f
        for f in reversed(range(self.buckets)):
            s = self.lru_head[w * self.head_stride + f]
            while s != EMPTY:
                order.append(s)
                s = self.link(2 * (w * self.capacity + s) + 1)
        return order

    def digest(self):
        """Hash of the whole state (holders, caches, LRU order), to compare across ranks."""
        h = hashlib.sha256()
        mine = self._persistent()
        for array in (mine["holders"], mine["slot_row"], *self._links(), mine["lru_head"], mine["used"], mine["freq"]):
            h.update(array.tobytes())
        return h.hexdigest()[:16]
