"""FAE's calibrator: which embedding rows are hot, and which inputs touch only hot rows.

FAE (VLDB'22; docs/design.md section 7) replicates the hot rows on every
worker and trains inputs that touch only hot rows without the PS. Which rows
are hot is decided once per dataset, cheaply:

1. **Sample the inputs** (default 5%) and count each row's accesses per
   table (the embedding logger). A sample tracks the whole data's profile.
2. **Estimate the hot-set size per cutoff without scanning the tables**
   (the Rand-Em box): for a cutoff ``H`` (a row is hot when its sampled
   count is ``>= H``), draw ``n = 35`` random chunks of ``m = 1024``
   consecutive rows, count the hot rows in each, and scale the chunks' mean
   to the table, with a Student-t confidence interval (99.9% by default)
   and the finite-population correction. 35 chunks make the mean normal
   whatever the counts' distribution (the central limit theorem).
3. **Pick the cutoff**: the lowest one (largest hot set) whose upper bound
   fits the memory budget (default 256 MB). Tables under 1 MB are hot
   whole and count against the budget.
4. **Classify**: a row is hot when its sampled count reaches the cutoff, an
   input is hot when every row it reads is hot.

Tables too small to hold ``n`` chunks are counted exactly, not sampled.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SMALL_TABLE_BYTES = 1 << 20  # FAE: tables under 1 MB are hot whole
CHUNKS = 35
CHUNK_ROWS = 1024


@dataclass(frozen=True)
class HotSetEstimate:
    """Hot rows of one table at one cutoff: the estimate and its confidence interval (rows)."""

    cutoff: int
    estimate: float
    lower: float
    upper: float
    exact: bool  # counted over the whole table (too small to sample)


@dataclass(frozen=True)
class Calibration:
    """The chosen cutoff and each table's hot rows (boolean masks over the table's ids)."""

    cutoff: int
    hot: list  # per table: bool [cardinality]
    estimated_bytes: float  # upper bound of the hot rows' bytes at the cutoff, small tables included
    budget_bytes: int
    sampled_inputs: int


def sample_positions(n_samples: int, fraction: float, seed: int) -> np.ndarray:
    """Sorted positions of a uniform sample of ``fraction`` of ``n_samples`` inputs (at least one)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"the sample fraction must be in (0, 1], got {fraction}")
    if n_samples < 1:
        raise ValueError("there are no inputs to sample")
    size = max(1, int(round(n_samples * fraction)))
    return np.sort(np.random.default_rng(seed).choice(n_samples, size=size, replace=False))


def access_counts(sparse: np.ndarray, cardinalities) -> list[np.ndarray]:
    """Per table, each row's accesses in ``sparse`` ([inputs, tables] ids): the embedding logger."""
    sparse = np.asarray(sparse)
    if sparse.ndim != 2 or sparse.shape[1] != len(cardinalities):
        raise ValueError(f"sparse: expected [inputs, {len(cardinalities)}] ids, got shape {sparse.shape}")
    counts = []
    for t, n in enumerate(cardinalities):
        ids = sparse[:, t]
        if len(ids) and (ids.min() < 0 or ids.max() >= n):
            raise ValueError(f"table {t}: ids must be in [0, {n}), got [{ids.min()}, {ids.max()}]")
        counts.append(np.bincount(ids, minlength=int(n)))
    return counts


def estimate_hot_rows(counts: np.ndarray, cutoff: int, rng: np.random.Generator, *, chunks: int = CHUNKS,
                      chunk_rows: int = CHUNK_ROWS, confidence: float = 0.999) -> HotSetEstimate:
    """Rows of one table with ``counts >= cutoff``, estimated from ``chunks`` random chunks (the Rand-Em box)."""
    if chunks < 2 or chunk_rows < 1:
        raise ValueError(f"need at least 2 chunks of at least 1 row, got {chunks} x {chunk_rows}")
    whole = len(counts) // chunk_rows
    if whole < 2 * chunks:  # sampling would read a large part of the table: count it
        exact = float(np.count_nonzero(counts >= cutoff))
        return HotSetEstimate(cutoff, exact, exact, exact, exact=True)
    picked = rng.choice(whole, size=chunks, replace=False)
    hot_per_chunk = (counts[:whole * chunk_rows].reshape(whole, chunk_rows)[picked] >= cutoff).sum(axis=1)
    scale = len(counts) / chunk_rows  # chunks in the table, partial chunk included
    mean, spread = hot_per_chunk.mean(), hot_per_chunk.std(ddof=1)
    from scipy import stats  # here, not at the top: scipy.stats costs every rank ~1 s of start-up

    t = stats.t.ppf(0.5 + confidence / 2, df=chunks - 1)
    half = t * np.sqrt((whole - chunks) / whole) * spread / np.sqrt(chunks)
    n = len(counts)
    return HotSetEstimate(cutoff, mean * scale, max(0.0, (mean - half) * scale), min(float(n), (mean + half) * scale),
                          exact=False)


def candidate_cutoffs(counts: list[np.ndarray]) -> np.ndarray:
    """Cutoffs to try, highest first: powers of two up to the largest count, and 1."""
    top = max((int(c.max()) for c in counts if len(c)), default=1)
    return np.unique(np.concatenate([[1], 2 ** np.arange(int(np.log2(max(top, 1))) + 1)]))[::-1]


def calibrate(sparse_sample: np.ndarray, cardinalities, *, row_bytes: int, budget_bytes: int = 256 << 20,
              seed: int = 0, sampled_inputs: int | None = None,
              small_table_bytes: int = SMALL_TABLE_BYTES) -> Calibration:
    """Choose the lowest cutoff whose estimated hot rows fit ``budget_bytes``; mark the hot rows.

    ``sparse_sample`` are the sampled inputs' ids ([inputs, tables]);
    ``row_bytes`` one row's size (dim x itemsize). When not even the highest
    cutoff fits, no large-table row is hot. A budget below the tables under
    ``small_table_bytes`` (1 MB in the paper), which are hot whole, is an error.
    """
    if row_bytes < 1 or budget_bytes < 0:
        raise ValueError(f"row_bytes must be >= 1 and budget_bytes >= 0, got {row_bytes} and {budget_bytes}")
    counts = access_counts(sparse_sample, cardinalities)
    small = [int(n) * row_bytes < small_table_bytes for n in cardinalities]
    small_bytes = sum(int(n) * row_bytes for n, s in zip(cardinalities, small) if s)
    if small_bytes > budget_bytes:
        raise ValueError(f"a budget of {budget_bytes / 2**20:.2f} MB is below the {small_bytes / 2**20:.2f} MB of "
                         f"the tables under {small_table_bytes / 2**20:g} MB, which are hot whole; raise "
                         f"fae.budget_mb")
    rng = np.random.default_rng(seed)
    chosen, chosen_bytes = None, float(small_bytes)
    for cutoff in candidate_cutoffs(counts):
        upper = sum(estimate_hot_rows(c, int(cutoff), rng).upper for c, s in zip(counts, small) if not s)
        if small_bytes + upper * row_bytes > budget_bytes:
            break
        chosen, chosen_bytes = int(cutoff), small_bytes + upper * row_bytes
    if chosen is None:  # nothing fits: a cutoff above every count
        chosen = 1 + max((int(c.max()) for c in counts if len(c)), default=0)
    cutoff = chosen
    hot = [np.ones(len(c), dtype=bool) if s else c >= cutoff for c, s in zip(counts, small)]
    return Calibration(cutoff=cutoff, hot=hot, estimated_bytes=chosen_bytes, budget_bytes=budget_bytes,
                       sampled_inputs=len(sparse_sample) if sampled_inputs is None else sampled_inputs)


def hot_inputs(sparse: np.ndarray, hot: list) -> np.ndarray:
    """Per input ([inputs, tables] ids): True when every row it reads is hot (the input processor)."""
    sparse = np.asarray(sparse)
    if sparse.ndim != 2 or sparse.shape[1] != len(hot):
        raise ValueError(f"sparse: expected [inputs, {len(hot)}] ids, got shape {sparse.shape}")
    result = np.ones(len(sparse), dtype=bool)
    for t, mask in enumerate(hot):
        result &= mask[sparse[:, t]]
    return result


def classify_store(sparse: np.ndarray, hot: list, chunk_rows: int = 1 << 18) -> np.ndarray:
    """:func:`hot_inputs` over a (memory-mapped) ``sparse`` array, a chunk at a time."""
    return np.concatenate([hot_inputs(np.asarray(sparse[begin:begin + chunk_rows]), hot)
                           for begin in range(0, len(sparse), chunk_rows)] or [np.zeros(0, dtype=bool)])


def calibrate_store(store, *, row_bytes: int, budget_bytes: int, sample_fraction: float, seed: int,
                    small_table_bytes: int = SMALL_TABLE_BYTES) -> dict:
    """Calibrate on a sample of ``store``'s inputs (its train split) and classify every one of them.

    Returns the arrays to keep beside the data: ``hot_rows`` (int64 global
    row ids), ``hot_inputs`` (bool per input of the split), and ``summary``
    (JSON-able: the cutoff, the hot rows per table, the estimate against
    the actual bytes, the share of hot inputs).
    """
    sparse = store.sparse()
    positions = sample_positions(len(sparse), sample_fraction, seed)
    result = calibrate(np.asarray(sparse[positions]), store.cardinalities, row_bytes=row_bytes,
                       budget_bytes=budget_bytes, seed=seed, small_table_bytes=small_table_bytes)
    classified = classify_store(sparse, result.hot)
    offsets = store.table_offsets
    hot_rows = np.concatenate([np.flatnonzero(mask) + offset for mask, offset in zip(result.hot, offsets)])
    summary = {"cutoff": result.cutoff, "sampled_inputs": int(len(positions)), "budget_bytes": budget_bytes,
               "row_bytes": row_bytes, "estimated_bytes": int(result.estimated_bytes),
               "hot_bytes": int(len(hot_rows)) * row_bytes, "hot_rows": int(len(hot_rows)),
               "hot_rows_per_table": [int(mask.sum()) for mask in result.hot],
               "inputs": int(len(classified)), "hot_inputs": int(classified.sum())}
    return {"hot_rows": hot_rows.astype(np.int64), "hot_inputs": classified, "summary": summary}


def calibration_key(store, *, row_bytes: int, budget_bytes: int, sample_fraction: float, seed: int,
                    small_table_bytes: int = SMALL_TABLE_BYTES) -> str:
    """Names a calibration by everything it depends on: the data, its split, the budget, the sample."""
    parts = [store.fingerprint, store.start, store.stop, row_bytes, budget_bytes, sample_fraction, seed]
    if small_table_bytes != SMALL_TABLE_BYTES:  # keys made before the setting existed stay valid
        parts.append(small_table_bytes)
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class StoredCalibration:
    """A calibration as kept beside the data."""

    path: Path
    summary: dict  # see calibrate_store
    hot_rows: np.ndarray  # int64 global row ids
    hot_inputs: np.ndarray  # bool per input of the split


def stored_calibration(store, *, row_bytes: int, budget_bytes: int, sample_fraction: float, seed: int,
                       small_table_bytes: int = SMALL_TABLE_BYTES, say=print) -> StoredCalibration:
    """The calibration kept beside the data (``STORE/fae/KEY/``); made and written first if missing.

    Written into a temporary sibling and renamed, so an interrupted run
    leaves no partial calibration; later runs of the same key reuse it.
    """
    key = calibration_key(store, row_bytes=row_bytes, budget_bytes=budget_bytes,
                          sample_fraction=sample_fraction, seed=seed, small_table_bytes=small_table_bytes)
    final = Path(store.path) / "fae" / key
    if not (final / "calibration.json").is_file():
        say(f"calibrating hot rows on {sample_fraction:.1%} of {store.n_samples} inputs -> {final}")
        made = calibrate_store(store, row_bytes=row_bytes, budget_bytes=budget_bytes,
                               sample_fraction=sample_fraction, seed=seed, small_table_bytes=small_table_bytes)
        final.parent.mkdir(exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=final.parent))
        try:
            np.save(staging / "hot_rows.npy", made["hot_rows"])
            np.save(staging / "hot_inputs.npy", made["hot_inputs"])
            (staging / "calibration.json").write_text(json.dumps(made["summary"], indent=1) + "\n")
            os.replace(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    stored = StoredCalibration(final, json.loads((final / "calibration.json").read_text()),
                               np.load(final / "hot_rows.npy", allow_pickle=False),
                               np.load(final / "hot_inputs.npy", allow_pickle=False))
    if len(stored.hot_inputs) != store.n_samples:
        raise ValueError(f"{final}: classifies {len(stored.hot_inputs)} inputs, the split has "
                         f"{store.n_samples}; delete the directory to calibrate again")
    return stored
