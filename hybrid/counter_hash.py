"""Counter-based hashing: randomness as a pure function of (seed, stream, counter).

Every rank must draw the same "random" numbers without sharing an RNG state,
and results must not depend on chunking or thread count (docs/design.md section 3).
So draws are hashes of their coordinates, never the next value of a stateful
generator. This is the NumPy twin of ``cython_ext/counter_hash.pxd``.
"""
from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_TWO_POW_53 = float(2**53)


def mix64(x: np.ndarray | int) -> np.ndarray:
    """splitmix64 finaliser on uint64 (wrapping arithmetic, vectorized)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def hash3(seed: int, stream: int, counter: np.ndarray | int) -> np.ndarray:
    """Hash of (seed, stream, counter) for an array of counters."""
    base = mix64(mix64(np.uint64(seed)) ^ np.uint64(stream))
    return mix64(base ^ np.asarray(counter, dtype=np.uint64))


def uniform3(seed: int, stream: int, counter: np.ndarray | int) -> np.ndarray:
    """Uniform doubles in [0, 1) from the top 53 bits of :func:`hash3`."""
    return (hash3(seed, stream, counter) >> np.uint64(11)).astype(np.float64) / _TWO_POW_53


def stream_id(*parts: int | str) -> int:
    """A 64-bit stream id from a readable name, e.g. ``stream_id("table", 3)``."""
    h = np.uint64(0)
    for part in parts:
        if isinstance(part, str):
            for byte in part.encode():
                h = mix64(h ^ np.uint64(byte))
        else:
            h = mix64(h ^ np.uint64(part & 0xFFFFFFFFFFFFFFFF))
    return int(h)
