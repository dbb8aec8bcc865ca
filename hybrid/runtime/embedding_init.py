"""Initial embedding values as a pure function of (seed, global row, column).

The PS ranks initialize their shards and the single-process reference its
whole tables with the same function, so both start from identical weights
however the rows are sharded. ``fill_initial_rows`` is the in-place kernel a
PS rank runs over its shard (no temporaries: start-up memory is the shard);
``initial_rows`` computes the same values for any set of rows, in NumPy.
"""
from __future__ import annotations

import os

import numpy as np

from hybrid._ext.hash_kernels import fill_uniform_rows
from hybrid.counter_hash import hash3, stream_id

_STREAM = stream_id("embedding-init")


def _scale(dim: int, scale: float | None) -> float:
    """Uniform(-1/sqrt(dim), 1/sqrt(dim)) by default, as DLRM's tables."""
    return 1.0 / np.sqrt(dim) if scale is None else scale


def initial_rows(seed: int, rows: np.ndarray, dim: int, dtype=np.float32, scale: float | None = None) -> np.ndarray:
    """Uniform(-scale, scale) values of ``rows`` (default scale 1/sqrt(dim), as DLRM's tables)."""
    rows = np.asarray(rows, dtype=np.uint64)
    cells = rows[:, None] * np.uint64(dim) + np.arange(dim, dtype=np.uint64)[None, :]
    u = (hash3(seed, _STREAM, cells) >> np.uint64(11)).astype(np.float64) / float(2**53)
    return ((2.0 * u - 1.0) * _scale(dim, scale)).astype(dtype)


def fill_initial_rows(out: np.ndarray, seed: int, first_row: int, scale: float | None = None,
                      threads: int | None = None) -> None:
    """Fill ``out`` ([n, dim], float32/64, C-contiguous) with the rows ``first_row ..`` in place."""
    threads = len(os.sched_getaffinity(0)) if threads is None else threads
    fill_uniform_rows(out, seed, _STREAM, first_row, _scale(out.shape[1], scale), threads)


def fill_initial_runs(shard: np.ndarray, seed: int, runs, scale: float | None = None,
                      dim: int | None = None) -> None:
    """Fill a PS shard in place from its plan's runs ``(local_start, first_row, count, stride, col_lo, width)``.

    Stride-1 runs of whole rows (whole tables, row ranges) use the in-place
    kernel; rows dealt round-robin and column slices (the shard viewed as
    rows of the slice's width) are computed in chunks of at most 1 << 16
    rows, so the temporaries stay small whatever the shard. ``dim``: the
    embedding's width when the stored rows are wider (an optimizer's state
    after each row, which starts at 0).
    """
    if dim is not None and dim != shard.shape[1]:
        _fill_with_state(shard, seed, runs, dim, scale)
        return
    dim = shard.shape[1]
    scale = _scale(dim, scale)  # a slice's values are its table's: the whole width sets the scale
    for start, first, count, stride, col_lo, width in runs:
        if stride == 1 and not width:
            fill_initial_rows(shard[start:start + count], seed, first, scale)
            continue
        target = shard.reshape(-1, width) if width else shard
        for done in range(0, count, 1 << 16):
            n = min(1 << 16, count - done)
            rows = first + stride * (done + np.arange(n, dtype=np.int64))
            values = initial_rows(seed, rows, dim, shard.dtype, scale)
            target[start + done:start + done + n] = values[:, col_lo:col_lo + width] if width else values


def _fill_with_state(shard: np.ndarray, seed: int, runs, dim: int, scale: float | None) -> None:
    """Rows of ``dim`` initial values followed by zeroed state columns (whole-row plans only)."""
    for start, first, count, stride, _, width in runs:
        if width:
            raise ValueError("rows with optimizer state cannot be split into column slices")
        for done in range(0, count, 1 << 16):
            n = min(1 << 16, count - done)
            rows = first + stride * (done + np.arange(n, dtype=np.int64))
            shard[start + done:start + done + n, :dim] = initial_rows(seed, rows, dim, shard.dtype, scale)
            shard[start + done:start + done + n, dim:] = 0
