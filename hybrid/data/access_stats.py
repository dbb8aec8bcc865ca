"""Access statistics of a store: skew, recurrence, reuse distance, co-occurrence.

These are the properties location-aware scheduling depends on, measured the
same way on synthetic and real data (``hybrid stats``): how concentrated the
accesses of each table are, how often rows recur and how close together, and
whether rows of different tables appear together more than chance.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from hybrid.counter_hash import hash3, stream_id

RECURRENCE_BINS = ((1, 1), (2, 9), (10, 99), (100, 999), (1000, None))
REUSE_QUANTILES = (10, 25, 50, 75, 90, 95, 99)
REUSE_BATCHES = (1, 2, 4, 8)
RECURRENCE_LOOKAHEAD = (1, 2, 4)


@dataclass(frozen=True)
class TableStats:
    name: str
    cardinality: int
    accessed_rows: int
    top1_share: float  # share of accesses taken by the most-accessed 1% of accessed rows
    top10_share: float
    recurrence: dict  # share of accessed rows seen k times, per RECURRENCE_BINS label
    reuse_median: float  # samples since the previous access of the same row (non-first accesses)
    reuse_p90: float
    reuse_within_batch: float  # share of non-first accesses within ``global_batch`` samples
    reuse_within_batches: dict  # "k": share of non-first accesses within k global batches
    batch_recurrence: dict  # "same" and "k": see batch_recurrence()

    def to_dict(self) -> dict:
        return asdict(self)


def top_share(counts: np.ndarray, fraction: float) -> float:
    """Share of all accesses taken by the most-accessed ``fraction`` of rows (at least one row)."""
    counts = np.sort(counts[counts > 0])[::-1]
    if len(counts) == 0:
        return 0.0
    k = max(1, int(round(len(counts) * fraction)))
    return float(counts[:k].sum() / counts.sum())


def reuse_distances(ids: np.ndarray) -> np.ndarray:
    """For each access that is not a row's first, the samples since its previous access."""
    order = np.argsort(ids, kind="stable")
    same = ids[order][1:] == ids[order][:-1]
    return (order[1:] - order[:-1])[same]


def reuse_quantiles(ids: np.ndarray, percents=REUSE_QUANTILES) -> dict:
    """Percentiles of the reuse distance, keyed by percent (NaN when no row recurs)."""
    distances = reuse_distances(ids)
    if len(distances) == 0:
        return {q: float("nan") for q in percents}
    return dict(zip(percents, (float(v) for v in np.percentile(distances, percents))))


def reuse_within_batches(ids: np.ndarray, batch: int, batches=REUSE_BATCHES) -> dict:
    """Share of reuses within ``k`` global batches (``k * batch`` samples), keyed by ``k``.

    The scale the scheduler sees: a row reused within a batch or two can still
    be in a worker's cache or fresh on the worker that trained it.
    """
    return _within_batches(reuse_distances(ids), batch, batches)


def _within_batches(distances: np.ndarray, batch: int, batches=REUSE_BATCHES) -> dict:
    """:func:`reuse_within_batches` on reuse distances already measured."""
    if len(distances) == 0:
        return {k: 0.0 for k in batches}
    return {k: float((distances <= k * batch).mean()) for k in batches}


def batch_recurrence(ids: np.ndarray, batch: int, lookahead=RECURRENCE_LOOKAHEAD) -> dict:
    """How a global batch's rows recur, averaged over the complete batches.

    ``"same"``: share of a batch's accesses that repeat a row already accessed
    in that batch (1 - distinct rows / batch). ``k``: share of a batch's
    distinct rows that appear again in one of the next ``k`` batches. These
    decide what location-aware allocation can keep local (a row trained by one
    worker and needed again soon) and what any cache can reuse.
    """
    n_batches = len(ids) // batch
    if n_batches == 0:
        return {"same": float("nan"), **{k: float("nan") for k in lookahead}}
    batch_of = np.repeat(np.arange(n_batches), batch)
    pairs = np.unique(np.asarray(ids[: n_batches * batch], dtype=np.int64) * n_batches + batch_of)
    rows, batches = pairs // n_batches, pairs % n_batches  # distinct (row, batch), sorted by row then batch
    distinct = np.bincount(batches, minlength=n_batches)
    result = {"same": float(1 - distinct.mean() / batch)}
    same_row = rows[1:] == rows[:-1]
    gap = np.where(same_row, batches[1:] - batches[:-1], np.iinfo(np.int64).max)  # to the row's next batch
    for k in lookahead:
        if n_batches <= k:
            result[k] = float("nan")
            continue
        counted = batches[:-1] < n_batches - k  # batches with k complete batches after them
        recur = np.bincount(batches[:-1][counted & (gap <= k)], minlength=n_batches)[: n_batches - k]
        result[k] = float((recur / distinct[: n_batches - k]).mean())
    return result


def recurrence_shares(counts: np.ndarray) -> dict:
    """Share of accessed rows by how many times they were accessed."""
    counts = counts[counts > 0]
    shares = {}
    for low, high in RECURRENCE_BINS:
        label = f"{low}" if low == high else (f"{low}+" if high is None else f"{low}-{high}")
        inside = (counts >= low) if high is None else ((counts >= low) & (counts <= high))
        shares[label] = float(inside.mean()) if len(counts) else 0.0
    return shares


def table_stats(name: str, ids: np.ndarray, cardinality: int, global_batch: int) -> TableStats:
    counts = np.bincount(ids, minlength=cardinality)
    distances = reuse_distances(ids)
    return TableStats(
        name=name,
        cardinality=int(cardinality),
        accessed_rows=int((counts > 0).sum()),
        top1_share=top_share(counts, 0.01),
        top10_share=top_share(counts, 0.10),
        recurrence=recurrence_shares(counts),
        reuse_median=float(np.median(distances)) if len(distances) else float("nan"),
        reuse_p90=float(np.percentile(distances, 90)) if len(distances) else float("nan"),
        reuse_within_batch=float((distances <= global_batch).mean()) if len(distances) else 0.0,
        reuse_within_batches={str(k): v for k, v in _within_batches(distances, global_batch).items()},
        batch_recurrence={str(k): v for k, v in batch_recurrence(ids, global_batch).items()},
    )


def shuffle_order(n: int, seed: int = 0) -> np.ndarray:
    """A seeded permutation of ``range(n)`` (the no-locality baseline)."""
    keys = hash3(seed, stream_id("stats-shuffle"), np.arange(n, dtype=np.uint64))
    return np.argsort(keys, kind="stable")


def shuffled(ids: np.ndarray, seed: int = 0) -> np.ndarray:
    """``ids`` in a seeded random order."""
    return ids[shuffle_order(len(ids), seed)]


def cooccurrence_ratio(a: np.ndarray, b: np.ndarray, seed: int = 0, permutation=None) -> float:
    """Distinct (a, b) pairs if b were independent of a, over distinct pairs observed.

    1.0 means no co-occurrence; larger means the rows of the two tables come
    in recurring combinations (what a latent user/context produces).
    ``permutation`` (of ``len(b)``) may be passed to reuse one shuffle for many pairs.
    """
    width = np.int64(int(b.max()) + 1)
    if permutation is None:
        permutation = shuffle_order(len(b), seed)
    observed = np.unique(a.astype(np.int64) * width + b).size
    independent = np.unique(a.astype(np.int64) * width + b[permutation]).size
    return independent / observed


def locality_ratio(ids: np.ndarray, max_count: int = 100, seed: int = 0) -> float:
    """Temporal locality: how much closer together a row's accesses are than chance.

    Median reuse distance after a seeded shuffle over the median in stored
    order, over the accesses of rows seen at most ``max_count`` times (hot
    rows recur constantly in any order and would hide the effect). 1.0 means
    no locality; bursts of recurring rows give values well above 1.
    """
    counts = np.bincount(ids)
    keep = ids[(counts[ids] >= 2) & (counts[ids] <= max_count)]
    if len(keep) == 0:
        return float("nan")
    in_order = np.median(reuse_distances(keep))
    baseline = np.median(reuse_distances(shuffled(keep, seed)))
    return float(baseline / max(1.0, in_order))


def store_stats(sparse: np.ndarray, table_names, cardinalities, global_batch: int) -> list[TableStats]:
    """Per-table statistics of a [samples, tables] id array."""
    return [table_stats(name, np.ascontiguousarray(sparse[:, t]), int(card), global_batch)
            for t, (name, card) in enumerate(zip(table_names, cardinalities))]


def overall_top_share(sparse: np.ndarray, cardinalities, fraction: float) -> float:
    """Top-``fraction`` share over all tables' rows together (the papers' 'top 10% of rows')."""
    counts = np.concatenate([np.bincount(sparse[:, t], minlength=int(c)) for t, c in enumerate(cardinalities)])
    return top_share(counts, fraction)
