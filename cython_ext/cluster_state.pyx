# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The cluster state: one source of truth for the scheduler, the caches and the simulator.

DESIGN.md section 3. For every embedding row ``e`` the state keeps ``L(e)``,
the set of holders of its latest value (bit 0 = PS, bit ``w + 1`` = worker
``w``), and for every worker a cache of ``capacity`` slots with LRU
replacement and a row -> slot map. It depends only on allocations, never on
gradient values, so every rank steps its own copy forward identically.

One iteration ``t`` is three calls:

1. ``set_needs(rows_t, alloc_t)`` (done by the previous ``plan`` or by the
   first call): which worker needs which row;
2. ``train()``: pull (with dirty write-backs on eviction) and update (local
   SGD for rows trained by one worker, Accumulate for shared rows; in
   full-set mode every trained row is pushed);
3. ``plan(rows_t1, alloc_t1)``: sets the needs of ``t + 1`` and, in
   on-demand mode, pushes the dirty rows another worker needs in ``t + 1``
   (Herald's Algorithm 2).

Memory: per row 8 bytes of holder bits per 64 holders plus 8 bytes of
scratch (epoch stamp and index in one word): 16 bytes per row up to 63 workers; per cache slot
4 (row) + 8 (LRU links) + 12 (row -> slot table of 8-byte entries at load
<= 2/3) = 24 bytes; LFU adds 4 (the slot's frequency bucket).
"""
import hashlib

import numpy as np
from libc.stdint cimport int32_t, int64_t, uint64_t

cdef extern from *:
    int popcount64 "__builtin_popcountll"(unsigned long long) nogil
    int ctz64 "__builtin_ctzll"(unsigned long long) nogil
    void prefetch "__builtin_prefetch"(const void*) nogil

# Rows are touched in random order, so the loops below are bound by memory
# latency; they prefetch the row a few steps ahead to overlap the misses.
cdef enum:
    AHEAD = 8
    LFU_BUCKETS = 256

# Event kinds recorded by train() and plan(); the runtime executes them, the
# simulator counts them (DESIGN.md section 6).
PULL, WRITEBACK, LOCAL, ACCUMULATE, FULL_SET_PUSH, PLAN_PUSH, P2P = range(7)
KIND_NAMES = ("pull", "writeback", "local", "accumulate", "full_set_push", "plan_push", "p2p")
cdef enum:
    PS_BIT = 0          # holder bit of the parameter server; worker w is bit w + 1
    EMPTY = -1

cdef enum:
    K_PULL = 0
    K_WRITEBACK = 1
    K_LOCAL = 2
    K_ACCUMULATE = 3
    K_FULL_SET_PUSH = 4
    K_PLAN_PUSH = 5
    K_P2P = 6


class StateError(RuntimeError):
    """The state machine reached a state DESIGN.md section 3 rules out."""


cdef int64_t LOW32 = (<int64_t>1 << 32) - 1


cdef inline uint64_t row_hash(int64_t row) noexcept nogil:
    cdef uint64_t x = <uint64_t>row * <uint64_t>0x9E3779B97F4A7C15ULL
    return x ^ (x >> 29)


cdef class ClusterState:
    """Holder sets of all rows and the caches of all workers; see the module docstring."""
    cdef readonly int n_workers
    cdef readonly int words                  # uint64 words per holder set (PS + workers)
    cdef readonly int64_t n_rows
    cdef readonly int64_t capacity           # cache slots per worker
    cdef readonly bint full_set              # vanilla synchronization: push every trained row
    cdef readonly bint p2p                   # P2P plans: a row one other worker needs goes owner -> worker
    cdef readonly int64_t max_pairs          # (row, worker) needs one iteration may hold

    # L(e): holders of the latest value of each row, words per row
    cdef uint64_t[::1] holders

    # caches, flattened [worker * capacity + slot]
    cdef int32_t[::1] slot_row               # row in the slot, EMPTY if free
    # Replacement order: per worker, frequency buckets of slots, each a list
    # from most to least recently used. LRU is the case of one bucket; LFU
    # evicts from the lowest non-empty bucket (counts saturate at buckets - 1).
    cdef readonly int buckets
    cdef int32_t[::1] lru_prev
    cdef int32_t[::1] lru_next
    cdef int32_t[::1] lru_head               # [worker * buckets + f]: most recent slot of bucket f
    cdef int32_t[::1] lru_tail               # least recent slot of bucket f
    cdef int32_t[::1] freq                   # LFU: bucket of each slot (unused with one bucket)
    cdef int32_t[::1] lowest                 # per worker: no non-empty bucket below this one
    cdef int32_t[::1] used                   # slots handed out per worker
    # row -> slot per worker: open addressing over slot ids, [worker * table_size + i]
    cdef int64_t[::1] table
    cdef int64_t table_size

    # needs of the current iteration: distinct rows, their worker sets, and
    # (worker, row) pairs sorted by worker
    cdef int64_t[::1] need_tag               # per row: epoch << 32 | index in need_rows (one load)
    cdef int32_t epoch
    cdef int64_t n_need
    cdef int64_t[::1] need_rows
    cdef uint64_t[::1] need_masks            # n_need * words, same bit layout as holders
    cdef int64_t n_pairs
    cdef int64_t[::1] pair_row
    cdef int32_t[::1] pair_worker
    cdef int32_t[::1] pair_slot
    cdef int32_t[::1] pair_need              # index of the pair's row in need_rows
    cdef int32_t[::1] pair_source            # P2P: worker sending the pair's row (EMPTY: none)
    cdef int32_t[::1] pair_source_slot
    cdef int32_t[::1] need_trainers          # workers needing each row
    cdef int64_t[::1] tmp_row                # set_needs scratch
    cdef int32_t[::1] tmp_worker
    cdef int32_t[::1] tmp_need
    cdef int64_t[::1] worker_fill
    cdef int64_t[::1] worker_start           # pairs of worker w: [worker_start[w], worker_start[w+1])
    cdef bint needs_ready

    # event records of the last train()/plan() call
    cdef int64_t[::1] ev_row
    cdef int32_t[::1] ev_worker
    cdef int32_t[::1] ev_slot
    cdef int32_t[::1] ev_kind
    cdef int32_t[::1] ev_peer                # P2P: the sending worker and its slot, else EMPTY
    cdef int32_t[::1] ev_peer_slot
    cdef int64_t n_events


    def __init__(self, *, int n_workers, int64_t n_rows, int64_t capacity, bint full_set,
                 int64_t max_pairs, bint p2p=False, str policy="lru"):
        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1, got {n_workers}")
        if n_rows < 1 or n_rows >= 2**31:
            raise ValueError(f"n_rows must be in [1, 2**31), got {n_rows}")
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1 slot, got {capacity}")
        if max_pairs < 1:
            raise ValueError(f"max_pairs must be >= 1, got {max_pairs}")
        self.n_workers = n_workers
        self.words = (n_workers + 1 + 63) // 64
        self.n_rows = n_rows
        self.capacity = capacity
        if p2p and full_set:
            raise ValueError("P2P plans need on-demand synchronization (full_set=False)")
        self.full_set = full_set
        self.p2p = p2p
        self.max_pairs = max_pairs

        self.holders = np.zeros(n_rows * self.words, dtype=np.uint64)
        cdef int64_t r
        for r in range(n_rows):
            self.holders[r * self.words] = 1  # L(e) = {PS}

        self.slot_row = np.full(n_workers * capacity, EMPTY, dtype=np.int32)
        if policy not in ("lru", "lfu"):
            raise ValueError(f"policy must be 'lru' or 'lfu', got {policy!r}")
        self.buckets = 1 if policy == "lru" else LFU_BUCKETS
        self.lru_prev = np.full(n_workers * capacity, EMPTY, dtype=np.int32)
        self.lru_next = np.full(n_workers * capacity, EMPTY, dtype=np.int32)
        self.lru_head = np.full(n_workers * self.buckets, EMPTY, dtype=np.int32)
        self.lru_tail = np.full(n_workers * self.buckets, EMPTY, dtype=np.int32)
        self.freq = np.zeros(n_workers * capacity if self.buckets > 1 else 1, dtype=np.int32)
        self.lowest = np.zeros(n_workers, dtype=np.int32)
        self.used = np.zeros(n_workers, dtype=np.int32)
        self.table_size = capacity + capacity // 2 + 1  # load <= 2/3
        self.table = np.full(n_workers * self.table_size, EMPTY, dtype=np.int64)

        self.need_tag = np.zeros(n_rows, dtype=np.int64)
        self.epoch = 0
        self.need_rows = np.zeros(max_pairs, dtype=np.int64)
        self.need_masks = np.zeros(max_pairs * self.words, dtype=np.uint64)
        self.pair_row = np.zeros(max_pairs, dtype=np.int64)
        self.pair_worker = np.zeros(max_pairs, dtype=np.int32)
        self.pair_slot = np.zeros(max_pairs, dtype=np.int32)
        self.pair_need = np.zeros(max_pairs, dtype=np.int32)
        self.pair_source = np.full(max_pairs, EMPTY, dtype=np.int32)
        self.pair_source_slot = np.full(max_pairs, EMPTY, dtype=np.int32)
        self.need_trainers = np.zeros(max_pairs, dtype=np.int32)
        self.tmp_row = np.zeros(max_pairs, dtype=np.int64)
        self.tmp_worker = np.zeros(max_pairs, dtype=np.int32)
        self.tmp_need = np.zeros(max_pairs, dtype=np.int32)
        self.worker_fill = np.zeros(n_workers + 1, dtype=np.int64)
        self.worker_start = np.zeros(n_workers + 1, dtype=np.int64)
        self.n_need = 0
        self.n_pairs = 0
        self.needs_ready = False

        self.ev_row = np.zeros(3 * max_pairs, dtype=np.int64)
        self.ev_worker = np.zeros(3 * max_pairs, dtype=np.int32)
        self.ev_slot = np.zeros(3 * max_pairs, dtype=np.int32)
        self.ev_kind = np.zeros(3 * max_pairs, dtype=np.int32)
        self.ev_peer = np.zeros(3 * max_pairs, dtype=np.int32)
        self.ev_peer_slot = np.zeros(3 * max_pairs, dtype=np.int32)
        self.n_events = 0

    # ---------------------------------------------------------------- holders
    cdef inline bint has_bit(self, int64_t row, int bit) noexcept nogil:
        return (self.holders[row * self.words + (bit >> 6)] >> (bit & 63)) & 1

    cdef inline void set_bit(self, int64_t row, int bit) noexcept nogil:
        self.holders[row * self.words + (bit >> 6)] |= (<uint64_t>1) << (bit & 63)

    cdef inline void clear_bit(self, int64_t row, int bit) noexcept nogil:
        self.holders[row * self.words + (bit >> 6)] &= ~((<uint64_t>1) << (bit & 63))

    cdef inline void set_only(self, int64_t row, int bit) noexcept nogil:
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
    # Entries pack (row << 32 | slot), so probing never reads slot_row: the
    # lookups run at memory latency and each avoided miss counts.
    cdef inline int64_t home(self, int64_t row) noexcept nogil:
        return <int64_t>(((row_hash(row) & LOW32) * <uint64_t>self.table_size) >> 32)

    cdef inline int32_t find(self, int w, int64_t row) noexcept nogil:
        cdef int64_t base = w * self.table_size
        cdef int64_t i = self.home(row)
        cdef int64_t entry
        while True:
            entry = self.table[base + i]
            if entry == EMPTY:
                return EMPTY
            if (entry >> 32) == row:
                return <int32_t>(entry & LOW32)
            i += 1
            if i == self.table_size:
                i = 0

    cdef inline void map_insert(self, int w, int64_t row, int32_t slot) noexcept nogil:
        cdef int64_t base = w * self.table_size
        cdef int64_t i = self.home(row)
        while self.table[base + i] != EMPTY:
            i += 1
            if i == self.table_size:
                i = 0
        self.table[base + i] = (row << 32) | slot

    cdef void map_erase(self, int w, int64_t row) noexcept nogil:
        """Linear-probing deletion with backward shift (no tombstones)."""
        cdef int64_t base = w * self.table_size
        cdef int64_t i = self.home(row), j, h
        cdef int64_t entry
        while (self.table[base + i] >> 32) != row:
            i += 1
            if i == self.table_size:
                i = 0
        j = i
        while True:
            j += 1
            if j == self.table_size:
                j = 0
            entry = self.table[base + j]
            if entry == EMPTY:
                break
            h = self.home(entry >> 32)
            # move the entry back into the hole at i unless its home lies cyclically in (i, j]
            if (j > i and (h <= i or h > j)) or (j < i and (h <= i and h > j)):
                self.table[base + i] = entry
                i = j
        self.table[base + i] = EMPTY

    # ------------------------------------------------------ replacement order
    cdef inline int32_t bucket_of(self, int w, int32_t s) noexcept nogil:
        return self.freq[w * self.capacity + s] if self.buckets > 1 else 0

    cdef inline void lru_unlink(self, int w, int32_t s) noexcept nogil:
        cdef int64_t b = w * self.capacity
        cdef int64_t head = w * self.buckets + self.bucket_of(w, s)
        cdef int32_t p = self.lru_prev[b + s], n = self.lru_next[b + s]
        if p != EMPTY:
            self.lru_next[b + p] = n
        else:
            self.lru_head[head] = n
        if n != EMPTY:
            self.lru_prev[b + n] = p
        else:
            self.lru_tail[head] = p

    cdef inline void lru_push_front(self, int w, int32_t s) noexcept nogil:
        cdef int64_t b = w * self.capacity
        cdef int32_t f = self.bucket_of(w, s)
        cdef int64_t head = w * self.buckets + f
        self.lru_prev[b + s] = EMPTY
        self.lru_next[b + s] = self.lru_head[head]
        if self.lru_head[head] != EMPTY:
            self.lru_prev[b + self.lru_head[head]] = s
        else:
            self.lru_tail[head] = s
        self.lru_head[head] = s
        if f < self.lowest[w]:
            self.lowest[w] = f

    cdef inline void lru_touch(self, int w, int32_t s) noexcept nogil:
        """An access: most recent in LRU; one bucket up (most recent there) in LFU."""
        cdef int64_t b = w * self.capacity
        if self.buckets == 1:
            if self.lru_head[w] != s:
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
        for f in range(self.lowest[w], self.buckets):
            s = self.lru_tail[w * self.buckets + f]
            if s == EMPTY:
                if f == self.lowest[w]:
                    self.lowest[w] = f + 1
                continue
            if not self.needed_by(self.slot_row[w * self.capacity + s], w):
                return s
        return EMPTY

    # ----------------------------------------------------------------- events
    cdef inline void record(self, int kind, int w, int64_t row, int32_t slot) noexcept nogil:
        self.record_p2p(kind, w, row, slot, EMPTY, EMPTY)

    cdef inline void record_p2p(self, int kind, int w, int64_t row, int32_t slot, int32_t peer,
                                int32_t peer_slot) noexcept nogil:
        self.ev_kind[self.n_events] = kind
        self.ev_worker[self.n_events] = w
        self.ev_row[self.n_events] = row
        self.ev_slot[self.n_events] = slot
        self.ev_peer[self.n_events] = peer
        self.ev_peer_slot[self.n_events] = peer_slot
        self.n_events += 1

    # ------------------------------------------------------------------ needs
    def set_needs(self, const int64_t[:, ::1] rows, const int32_t[::1] alloc):
        """Needs of the next iteration to train: sample ``i`` (rows ``rows[i]``) on ``alloc[i]``."""
        if rows.shape[0] != alloc.shape[0]:
            raise ValueError(f"rows has {rows.shape[0]} samples but alloc has {alloc.shape[0]}")
        if rows.shape[0] * rows.shape[1] > self.max_pairs:
            raise ValueError(f"batch of {rows.shape[0]} x {rows.shape[1]} ids exceeds max_pairs={self.max_pairs}")
        if rows.shape[0] == 0:
            raise ValueError("an empty batch has no needs")
        bad = np.flatnonzero((np.asarray(alloc) < 0) | (np.asarray(alloc) >= self.n_workers))
        if len(bad):
            raise ValueError(f"alloc[{bad[0]}] = {alloc[bad[0]]} is not a worker in [0, {self.n_workers})")
        if rows.shape[1] and (np.asarray(rows).min() < 0 or np.asarray(rows).max() >= self.n_rows):
            where = np.argwhere((np.asarray(rows) < 0) | (np.asarray(rows) >= self.n_rows))[0]
            raise ValueError(f"rows[{where[0]}, {where[1]}] = {np.asarray(rows)[tuple(where)]} "
                             f"is not a row in [0, {self.n_rows})")
        cdef int64_t i, t, e, k, p, tag, n_tmp = 0
        cdef int w, bit
        cdef uint64_t flag
        cdef int64_t epoch_bits
        with nogil:
            self.epoch += 1
            epoch_bits = (<int64_t>self.epoch) << 32
            self.n_need = 0
            for w in range(self.n_workers + 1):
                self.worker_fill[w] = 0
            for i in range(rows.shape[0]):
                w = alloc[i]
                bit = w + 1
                flag = (<uint64_t>1) << (bit & 63)
                if i + 1 < rows.shape[0]:
                    for t in range(rows.shape[1]):
                        prefetch(&self.need_tag[rows[i + 1, t]])
                for t in range(rows.shape[1]):
                    e = rows[i, t]
                    tag = self.need_tag[e]
                    if (tag >> 32) != self.epoch:
                        tag = epoch_bits | self.n_need
                        self.need_tag[e] = tag
                        self.need_rows[self.n_need] = e
                        self.need_trainers[self.n_need] = 0
                        for k in range(self.words):
                            self.need_masks[self.n_need * self.words + k] = 0
                        self.n_need += 1
                    k = (tag & LOW32) * self.words + (bit >> 6)
                    if not (self.need_masks[k] & flag):
                        self.need_masks[k] |= flag
                        self.need_trainers[tag & LOW32] += 1
                        self.tmp_row[n_tmp] = e
                        self.tmp_worker[n_tmp] = w
                        self.tmp_need[n_tmp] = <int32_t>(tag & LOW32)
                        n_tmp += 1
                        self.worker_fill[w + 1] += 1
            # counting sort of (worker, row) pairs by worker, first-appearance order within
            for w in range(self.n_workers):
                self.worker_fill[w + 1] += self.worker_fill[w]
            for w in range(self.n_workers + 1):
                self.worker_start[w] = self.worker_fill[w]
            for p in range(n_tmp):
                w = self.tmp_worker[p]
                k = self.worker_fill[w]
                self.worker_fill[w] += 1
                self.pair_row[k] = self.tmp_row[p]
                self.pair_worker[k] = w
                self.pair_need[k] = self.tmp_need[p]
                self.pair_slot[k] = EMPTY
                self.pair_source[k] = EMPTY
            self.n_pairs = n_tmp
        self.needs_ready = True

    # ------------------------------------------------------------------ train
    def train(self):
        """Pull and update for the current needs (steps 2 and 4). Returns event counts."""
        if not self.needs_ready:
            raise StateError("train() needs set_needs() (or the previous plan()) first")
        cdef int64_t bad_row = -1
        cdef int w
        with nogil:
            self.n_events = 0
            if self.p2p:
                self.match_p2p()
            for w in range(self.n_workers):
                bad_row = self.pull_worker(w)
                if bad_row >= 0:
                    break
            if bad_row < 0:
                self.update()
        if bad_row >= 0:
            raise StateError(f"row {bad_row}: needed by worker {w} but neither fresh there nor held by the PS"
                             if bad_row < self.n_rows else
                             f"worker {w}: cache of {self.capacity} slots cannot hold this iteration's "
                             f"working set; raise the cache size")
        self.needs_ready = False
        return self.counts()

    cdef void match_p2p(self) noexcept nogil:
        """P2P: a row dirty on ``w`` and needed by one other worker ``v`` goes straight ``w`` -> ``v``.

        Decided for all workers before any of them evicts, so the sender's
        copy is still in its slot; from here on ``w`` and ``v`` both hold it
        (``w``'s copy is no longer dirty: evicting it needs no write-back).
        """
        cdef int64_t p, e
        cdef int owner, v
        for p in range(self.n_pairs):
            e = self.pair_row[p]
            v = self.pair_worker[p]
            owner = self.dirty_owner(e)
            if owner >= 0 and owner != v:
                self.pair_source[p] = owner
                self.pair_source_slot[p] = self.find(owner, e)
                self.set_bit(e, v + 1)

    cdef int64_t pull_worker(self, int w) noexcept nogil:
        """Step 2 for worker ``w``; returns -1, or the offending row (n_rows + x: cache too small)."""
        cdef int64_t p, e, victim, cbase = w * self.capacity
        cdef int64_t first = self.worker_start[w], last = self.worker_start[w + 1]
        cdef int32_t s
        cdef int owner
        if last - first > self.capacity:
            return self.n_rows
        # Pin: touch every cached row needed now, so the LRU tail holds only unneeded rows.
        for p in range(first, last):
            if p + AHEAD < last:
                prefetch(&self.table[w * self.table_size + self.home(self.pair_row[p + AHEAD])])
                prefetch(&self.holders[self.pair_row[p + AHEAD] * self.words])
            s = self.find(w, self.pair_row[p])
            self.pair_slot[p] = s
            if s != EMPTY:
                self.lru_touch(w, s)
        for p in range(first, last):
            e = self.pair_row[p]
            if self.pair_source[p] == EMPTY:
                if self.fresh(e, w):
                    continue
                if not self.has_bit(e, PS_BIT):
                    return e
            s = self.pair_slot[p]
            if s == EMPTY:
                if self.used[w] < self.capacity:
                    s = self.used[w]
                    self.used[w] += 1
                else:
                    s = self.victim(w)
                    if s == EMPTY:
                        return self.n_rows
                    victim = self.slot_row[cbase + s]
                    owner = self.dirty_owner(victim)
                    if owner == w:
                        self.record(K_WRITEBACK, w, victim, s)
                        self.set_only(victim, PS_BIT)
                    else:
                        self.clear_bit(victim, w + 1)
                    self.map_erase(w, victim)
                    self.lru_unlink(w, s)
                self.slot_row[cbase + s] = <int32_t>e
                self.map_insert(w, e, s)
                self.lru_insert(w, s)
                self.pair_slot[p] = s
            if self.pair_source[p] == EMPTY:
                self.record(K_PULL, w, e, s)
                self.set_bit(e, w + 1)
            else:
                self.record_p2p(K_P2P, w, e, s, self.pair_source[p], self.pair_source_slot[p])
        return -1

    cdef inline bint needed_by(self, int64_t row, int w) noexcept nogil:
        cdef int bit = w + 1
        cdef int64_t tag = self.need_tag[row]
        if (tag >> 32) != self.epoch:
            return False
        return (self.need_masks[(tag & LOW32) * self.words + (bit >> 6)] >> (bit & 63)) & 1

    cdef void update(self) noexcept nogil:
        """Step 4: who holds the latest value of each trained row after the update."""
        cdef int64_t p, e
        cdef int w
        for p in range(self.n_pairs):
            if p + AHEAD < self.n_pairs:
                prefetch(&self.holders[self.pair_row[p + AHEAD] * self.words])
            e = self.pair_row[p]
            w = self.pair_worker[p]
            if self.need_trainers[self.pair_need[p]] >= 2:
                self.record(K_ACCUMULATE, w, e, self.pair_slot[p])
                self.set_only(e, PS_BIT)
            elif self.full_set:
                self.record(K_FULL_SET_PUSH, w, e, self.pair_slot[p])
                self.set_only(e, PS_BIT)
                self.set_bit(e, w + 1)
            else:
                self.record(K_LOCAL, w, e, self.pair_slot[p])
                self.set_only(e, w + 1)

    # ------------------------------------------------------------------- plan
    def plan(self, rows_next=None, alloc_next=None):
        """Set the needs of ``t + 1`` and push what they require (step 5). Returns event counts.

        Without a next batch (the last iteration) nothing is planned. In
        full-set mode no row is ever dirty, so the plan is always empty.
        """
        self.n_events = 0
        if rows_next is None:
            self.needs_ready = False
            return self.counts()
        self.set_needs(rows_next, alloc_next)
        cdef int64_t p, e
        cdef int owner
        with nogil:
            for p in range(self.n_pairs):
                if p + AHEAD < self.n_pairs:
                    prefetch(&self.holders[self.pair_row[p + AHEAD] * self.words])
                e = self.pair_row[p]
                owner = self.dirty_owner(e)
                if self.p2p and self.need_trainers[self.pair_need[p]] == 1:
                    continue  # only this worker needs it: sent peer to peer when t + 1 starts
                if owner >= 0 and owner != self.pair_worker[p]:
                    self.record(K_PLAN_PUSH, owner, e, self.find(owner, e))
                    self.set_bit(e, PS_BIT)
        return self.counts()

    # ------------------------------------------------------------- flushing
    def flush_dirty(self):
        """Give every dirty row to the PS too (before evaluation or a checkpoint).

        Returns (worker, row, slot) arrays of the rows each worker must write
        back; afterwards the PS holds the latest value of every row.
        """
        workers, rows, slots = [], [], []
        cdef int64_t e
        cdef int owner
        for e in range(self.n_rows):
            owner = self.dirty_owner(e)
            if owner >= 0:
                workers.append(owner)
                rows.append(e)
                slots.append(self.find(owner, e))
                self.set_bit(e, PS_BIT)
        return (np.asarray(workers, dtype=np.int32), np.asarray(rows, dtype=np.int64),
                np.asarray(slots, dtype=np.int32))

    # ------------------------------------------------------------ copying
    def copy(self):
        """An independent state with the same contents (for what-if evaluation)."""
        clone = ClusterState(n_workers=self.n_workers, n_rows=self.n_rows, capacity=self.capacity,
                             full_set=self.full_set, max_pairs=self.max_pairs, p2p=self.p2p,
                             policy="lru" if self.buckets == 1 else "lfu")
        clone.holders[:] = self.holders
        clone.slot_row[:] = self.slot_row
        clone.lru_prev[:] = self.lru_prev
        clone.lru_next[:] = self.lru_next
        clone.lru_head[:] = self.lru_head
        clone.lru_tail[:] = self.lru_tail
        clone.freq[:] = self.freq
        clone.lowest[:] = self.lowest
        clone.used[:] = self.used
        clone.table[:] = self.table
        clone.need_tag[:] = self.need_tag
        clone.epoch = self.epoch
        clone.need_rows[:] = self.need_rows
        clone.need_masks[:] = self.need_masks
        clone.n_need = self.n_need
        clone.pair_row[:] = self.pair_row
        clone.pair_worker[:] = self.pair_worker
        clone.pair_slot[:] = self.pair_slot
        clone.pair_need[:] = self.pair_need
        clone.pair_source[:] = self.pair_source
        clone.pair_source_slot[:] = self.pair_source_slot
        clone.need_trainers[:] = self.need_trainers
        clone.worker_start[:] = self.worker_start
        clone.n_pairs = self.n_pairs
        clone.needs_ready = self.needs_ready
        return clone

    # ------------------------------------------------------------ inspection
    def holder_words(self):
        """The raw holder bitsets, a live view [n_rows * words] (bit w + 1 = worker w): LAIA scores from it."""
        return np.asarray(self.holders)

    def counts(self):
        """Events of the last train()/plan() call by kind name."""
        kinds = np.asarray(self.ev_kind[:self.n_events])
        tally = np.bincount(kinds, minlength=len(KIND_NAMES))
        return dict(zip(KIND_NAMES, (int(x) for x in tally)))

    def events(self):
        """Events of the last call as arrays: kind, worker, row, slot (in execution order)."""
        n = self.n_events
        return (np.asarray(self.ev_kind[:n]).copy(), np.asarray(self.ev_worker[:n]).copy(),
                np.asarray(self.ev_row[:n]).copy(), np.asarray(self.ev_slot[:n]).copy())

    def peers(self):
        """For the events of the last call: sending worker and its slot of P2P events, else -1."""
        n = self.n_events
        return np.asarray(self.ev_peer[:n]).copy(), np.asarray(self.ev_peer_slot[:n]).copy()

    def holder_sets(self):
        """``L(e)`` of every row as a bool array [n_rows, 1 + n_workers] (column 0 = PS)."""
        words = np.asarray(self.holders).reshape(self.n_rows, self.words)
        bits = np.unpackbits(words.view(np.uint8).reshape(self.n_rows, -1), axis=1, bitorder="little")
        return bits[:, :1 + self.n_workers].astype(bool)

    def cache_rows(self, int w):
        """Rows in worker ``w``'s cache by slot (-1 = free slot)."""
        return np.asarray(self.slot_row[w * self.capacity:(w + 1) * self.capacity]).copy()

    def slot_of(self, int w, int64_t row):
        """Slot of ``row`` in worker ``w``'s cache, or -1."""
        return self.find(w, row)

    def lru_order(self, int w):
        """Slots of worker ``w`` from last to first to be evicted (LFU: highest bucket first)."""
        order = []
        cdef int32_t s, f
        for f in reversed(range(self.buckets)):
            s = self.lru_head[w * self.buckets + f]
            while s != EMPTY:
                order.append(s)
                s = self.lru_next[w * self.capacity + s]
        return order

    def digest(self):
        """Hash of the whole state (holders, caches, LRU order), to compare across ranks."""
        h = hashlib.sha256()
        for array in (np.asarray(self.holders), np.asarray(self.slot_row), np.asarray(self.lru_prev),
                      np.asarray(self.lru_next), np.asarray(self.lru_head), np.asarray(self.used),
                      np.asarray(self.freq)):
            h.update(array.tobytes())
        return h.hexdigest()[:16]
