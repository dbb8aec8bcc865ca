"""Initial embedding values as a pure function of (seed, global row, column).

The PS ranks initialize their shards and the single-process reference its
whole tables with the same function, so both start from identical weights
however the rows are sharded.
"""
from __future__ import annotations

import numpy as np

from hybrid.counter_hash import hash3, stream_id


def initial_rows(seed: int, rows: np.ndarray, dim: int, dtype=np.float32, scale: float | None = None) -> np.ndarray:
    """Uniform(-scale, scale) values of ``rows`` (default scale 1/sqrt(dim), as DLRM's tables)."""
    rows = np.asarray(rows, dtype=np.uint64)
    scale = 1.0 / np.sqrt(dim) if scale is None else scale
    cells = rows[:, None] * np.uint64(dim) + np.arange(dim, dtype=np.uint64)[None, :]
    u = (hash3(seed, stream_id("embedding-init"), cells) >> np.uint64(11)).astype(np.float64) / float(2**53)
    return ((2.0 * u - 1.0) * scale).astype(dtype)
