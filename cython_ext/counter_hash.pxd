# Counter-based hashing shared by every Cython kernel.
#
# Randomness in this project must not depend on call order, thread timing or
# chunking (docs/design.md section 3): each draw is a pure function of
# (seed, stream, counter). These inline functions are the C twin of
# hybrid/counter_hash.py; a unit test checks that both agree bit for bit.
from libc.stdint cimport uint64_t

cdef inline uint64_t mix64(uint64_t x) noexcept nogil:
    """splitmix64 finaliser: a bijection on 64-bit words with full avalanche."""
    x = x + <uint64_t>0x9E3779B97F4A7C15ULL
    x = (x ^ (x >> 30)) * <uint64_t>0xBF58476D1CE4E5B9ULL
    x = (x ^ (x >> 27)) * <uint64_t>0x94D049BB133111EBULL
    return x ^ (x >> 31)

cdef inline uint64_t hash3(uint64_t seed, uint64_t stream, uint64_t counter) noexcept nogil:
    """Hash of (seed, stream, counter); streams separate independent uses."""
    return mix64(mix64(mix64(seed) ^ stream) ^ counter)

cdef inline double uniform3(uint64_t seed, uint64_t stream, uint64_t counter) noexcept nogil:
    """Uniform double in [0, 1) from the top 53 bits of hash3."""
    return <double>(hash3(seed, stream, counter) >> 11) * (1.0 / 9007199254740992.0)

# Digests that ranks compare every iteration (the cluster state's events, the plan's allocation): not
# counter-based and with no NumPy twin. Four chains of one multiply per 64-bit word, folded at the end,
# so that consecutive words' multiplies overlap instead of waiting on each other.
cdef inline uint64_t chain64(uint64_t x, uint64_t word) noexcept nogil:
    """One word into a digest chain."""
    x = (x ^ word) * <uint64_t>0x9E3779B97F4A7C15ULL
    return x ^ (x >> 32)

cdef inline uint64_t fold4(uint64_t a, uint64_t b, uint64_t c, uint64_t d) noexcept nogil:
    """Four chains into one digest."""
    return mix64(a ^ mix64(b ^ mix64(c ^ mix64(d))))
