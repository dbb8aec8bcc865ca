# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The latent-context process behind the synthetic datasets.

A sample's context stands for the user/session that produced it: several
feature tables are functions of it (co-occurrence) and it recurs in bursts
(temporal locality). ``n_active`` sessions run at once; each sample belongs to
one of them (uniform, hashed), and after each sample its session ends with
probability ``1 / mean_length`` and is replaced by a new context drawn from the
context popularity CDF. The loop is sequential by nature (a session's state
depends on every earlier sample), so it lives here rather than in NumPy.

Two optional behaviours, both measured on real MovieLens-100k (docs/data.md,
"Synthetic data"), model how users actually produce a time-ordered stream:

- ``stickiness``: with this probability a sample continues the previous
  sample's session instead of a uniformly chosen one, so a user's samples come
  in runs (a page of ratings submitted at once) rather than finely interleaved.
- ``revisit``: with this probability a new session is the return of one of
  the ``recent`` most recently ended sessions' contexts (a user coming back
  the same day) instead of a fresh popularity draw.

Both default to 0, which leaves the stream exactly as without them. The
process also counts each context's samples so far (``take_counted``): the
k-th sample of a context can then pick the k-th element of that context's own
order of rows, which is how a user rates an item at most once.

Draws are counter-based hashes of (seed, sample position), so the stream is
the same however it is cut into chunks.
"""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int64_t, uint64_t
from counter_hash cimport hash3, uniform3

cnp.import_array()

cdef enum:
    STREAM_SLOT = 1
    STREAM_END = 2
    STREAM_NEW = 3
    STREAM_INIT = 4
    STREAM_STAY = 5
    STREAM_REVISIT = 6
    STREAM_PICK = 7
    STREAM_RECENT_INIT = 8


cdef inline int64_t draw(const double[::1] cdf, double u) noexcept nogil:
    """Index of the first CDF entry > u (binary search)."""
    cdef int64_t lo = 0, hi = cdf.shape[0] - 1, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if cdf[mid] > u:
            hi = mid
        else:
            lo = mid + 1
    return lo


cdef class SessionProcess:
    """Stateful view of the context stream; ``take(n)`` continues where it stopped."""
    cdef uint64_t seed
    cdef double end_probability, stickiness, revisit
    cdef int64_t produced, previous_slot, ended
    cdef double[::1] cdf
    cdef int64_t[::1] active
    cdef int64_t[::1] recent
    cdef int64_t[::1] seen

    def __init__(self, *, uint64_t seed, int64_t n_active, double mean_length,
                 context_cdf, double stickiness=0.0, double revisit=0.0, int64_t recent=64):
        if n_active < 1:
            raise ValueError(f"n_active must be >= 1, got {n_active}")
        if mean_length < 1.0:
            raise ValueError(f"mean_length must be >= 1, got {mean_length}")
        if not (0.0 <= stickiness < 1.0):
            raise ValueError(f"stickiness must be in [0, 1), got {stickiness}")
        if not (0.0 <= revisit <= 1.0):
            raise ValueError(f"revisit must be in [0, 1], got {revisit}")
        if recent < 1:
            raise ValueError(f"recent must be >= 1, got {recent}")
        cdf = np.ascontiguousarray(context_cdf, dtype=np.float64)
        if cdf.ndim != 1 or cdf.shape[0] < 1:
            raise ValueError(f"context_cdf must be a non-empty 1-d array, got shape {cdf.shape}")
        self.seed = seed
        self.end_probability = 1.0 / mean_length
        self.stickiness = stickiness
        self.revisit = revisit
        self.produced = 0
        self.previous_slot = 0
        self.ended = 0
        self.cdf = cdf
        self.active = np.empty(n_active, dtype=np.int64)
        self.recent = np.empty(recent, dtype=np.int64)
        self.seen = np.zeros(cdf.shape[0], dtype=np.int64)
        cdef int64_t s
        for s in range(n_active):
            self.active[s] = draw(self.cdf, uniform3(seed, STREAM_INIT, <uint64_t>s))
        for s in range(recent):
            self.recent[s] = draw(self.cdf, uniform3(seed, STREAM_RECENT_INIT, <uint64_t>s))

    @property
    def position(self):
        """Number of samples produced so far."""
        return self.produced

    def take(self, int64_t n):
        """Contexts of the next ``n`` samples (int64 array)."""
        return self.take_counted(n)[0]

    def take_counted(self, int64_t n):
        """Contexts of the next ``n`` samples and, per sample, its context's earlier samples (int64 arrays)."""
        out_array = np.empty(n, dtype=np.int64)
        counts_array = np.empty(n, dtype=np.int64)
        cdef int64_t[::1] out = out_array
        cdef int64_t[::1] counts = counts_array
        cdef int64_t i, slot, context, k = self.active.shape[0], r = self.recent.shape[0]
        cdef uint64_t pos
        with nogil:
            for i in range(n):
                pos = <uint64_t>(self.produced + i)
                if self.stickiness > 0.0 and uniform3(self.seed, STREAM_STAY, pos) < self.stickiness:
                    slot = self.previous_slot
                else:
                    slot = <int64_t>(hash3(self.seed, STREAM_SLOT, pos) % <uint64_t>k)
                self.previous_slot = slot
                context = self.active[slot]
                out[i] = context
                counts[i] = self.seen[context]
                self.seen[context] += 1
                if uniform3(self.seed, STREAM_END, pos) < self.end_probability:
                    self.recent[self.ended % r] = context
                    self.ended += 1
                    if self.revisit > 0.0 and uniform3(self.seed, STREAM_REVISIT, pos) < self.revisit:
                        self.active[slot] = self.recent[<int64_t>(hash3(self.seed, STREAM_PICK, pos) % <uint64_t>r)]
                    else:
                        self.active[slot] = draw(self.cdf, uniform3(self.seed, STREAM_NEW, pos))
        self.produced += n
        return out_array, counts_array
