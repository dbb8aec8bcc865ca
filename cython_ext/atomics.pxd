# Atomic operations for the kernels that share arrays between threads.
#
# The scheduler's threads write disjoint parts of the cluster state, except
# where two workers touch the same row: its holder bits (different bits of
# one word), the insert-only needs table, the written-row bitmap and the
# rows' use counts. Those writes use these GCC
# builtins; everything a thread alone writes stays plain. The ``*_if``
# forms take ``shared`` (more than one thread runs): a locked instruction
# drains the store buffer and stalls the loads behind it, so one thread
# writes plainly.
# docs/design.md, section 3 ("Threads").
from libc.stdint cimport int32_t, int64_t, uint64_t

cdef extern from *:
    """
    #include <stdint.h>
    static inline uint64_t hybrid_fetch_or_u64(uint64_t *p, uint64_t v) {
        return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
    static inline void hybrid_and_u64(uint64_t *p, uint64_t v) { __atomic_fetch_and(p, v, __ATOMIC_RELAXED); }
    static inline int64_t hybrid_load_i64(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void hybrid_store_i64(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline int hybrid_cas_i64(int64_t *p, int64_t expected, int64_t desired) {
        return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE); }
    static inline int64_t hybrid_fetch_add_i64(int64_t *p, int64_t v) {
        return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
    static inline int32_t hybrid_fetch_add_i32(int32_t *p, int32_t v) {
        return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
    static inline void hybrid_or_u64_if(uint64_t *p, uint64_t v, int shared) {
        if (shared) __atomic_fetch_or(p, v, __ATOMIC_RELAXED); else *p |= v; }
    static inline void hybrid_and_u64_if(uint64_t *p, uint64_t v, int shared) {
        if (shared) __atomic_fetch_and(p, v, __ATOMIC_RELAXED); else *p &= v; }
    /* One thread: *p is still the ``expected`` it has just read. */
    static inline int hybrid_cas_i64_if(int64_t *p, int64_t expected, int64_t desired, int shared) {
        if (!shared) { *p = desired; return 1; }
        return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE); }
    """
    uint64_t fetch_or_u64 "hybrid_fetch_or_u64"(uint64_t* p, uint64_t v) noexcept nogil
    void and_u64 "hybrid_and_u64"(uint64_t* p, uint64_t v) noexcept nogil
    int64_t load_i64 "hybrid_load_i64"(const int64_t* p) noexcept nogil
    void store_i64 "hybrid_store_i64"(int64_t* p, int64_t v) noexcept nogil
    bint cas_i64 "hybrid_cas_i64"(int64_t* p, int64_t expected, int64_t desired) noexcept nogil
    int64_t fetch_add_i64 "hybrid_fetch_add_i64"(int64_t* p, int64_t v) noexcept nogil
    int32_t fetch_add_i32 "hybrid_fetch_add_i32"(int32_t* p, int32_t v) noexcept nogil
    void or_u64_if "hybrid_or_u64_if"(uint64_t* p, uint64_t v, bint shared) noexcept nogil
    void and_u64_if "hybrid_and_u64_if"(uint64_t* p, uint64_t v, bint shared) noexcept nogil
    bint cas_i64_if "hybrid_cas_i64_if"(int64_t* p, int64_t expected, int64_t desired, bint shared) noexcept nogil
