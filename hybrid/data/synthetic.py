"""Synthetic datasets shaped like the public ones, written as a normal store.

The model (docs/data.md, "Synthetic data", documents it and its measured statistics):

- **Tables** keep the public per-table cardinalities scaled by ``scale``
  (tables of up to 32 rows keep their size: a device-type field does not grow
  with the data; larger ones never scale below 32). Row ``k`` of a table has
  popularity proportional to ``(k + 1) ** -zipf``, with a per-table exponent:
  some tables are almost uniform, some extremely skewed. Row ids are thus in
  popularity order, as ``hybrid preprocess`` assigns them.
- **Co-occurrence.** Each sample has a latent context (the user/session that
  produced it). With per-table probability ``coupling`` a feature is a
  function of the context (the context's own draw from the table's skew),
  otherwise an independent draw. Coupled tables' rows therefore appear
  together.
- **Temporal locality.** Contexts come from a session process
  (``cython_ext/session_process.pyx``): ``sessions`` contexts are active at
  once, each sample belongs to one of them, sessions last ``session_length``
  samples on average and new ones draw contexts by Zipf popularity. A context
  recurs in bursts over nearby samples, and across the whole data a few to a
  few hundred times. Two behaviours measured on real MovieLens-100k refine
  it: ``stickiness`` (a sample continues the previous sample's session: a
  user's samples come in runs) and ``revisit`` (a new session is, with that
  probability, the return of one of the ``recent`` last ended sessions: users
  come back within a few batches).
- **Users as contexts.** ``context_table`` names a table whose row *is* the
  context (MovieLens' user), drawn by that table's popularity. A ``distinct``
  table takes each row at most once per context: the context's k-th sample
  takes the k-th row of its own popularity-weighted random order (a user
  rates a movie once), which caps the popular rows' counts near the number
  of contexts. ``cutoff`` multiplies a table's popularity by
  ``exp(-k / (cutoff * rows))``: a Zipf head with an exponential tail, the
  shape of MovieLens' item counts.
- **Labels** follow a logistic model of per-row weights, a per-context
  propensity and the dense features, with a bias set for the public positive
  rate, so that a model can learn them (AUC well above 0.5).

Every draw is a counter-based hash of (seed, purpose, position), so the data
depend only on the seed, never on chunk sizes.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from hybrid._ext.session_process import SessionProcess
from hybrid.counter_hash import stream_id, uniform3
from hybrid.data.store import StoreWriter

MIN_SCALED_ROWS = 32
CHUNK = 1 << 16


@dataclass(frozen=True)
class TableSpec:
    name: str
    cardinality: int  # public full-size cardinality
    zipf: float  # popularity exponent of row k: (k + 1) ** -zipf
    coupling: float  # probability that the value is a function of the context
    cutoff: float = 0.0  # > 0: popularity also times exp(-k / (cutoff * rows)), an exponential tail
    distinct: bool = False  # each context takes each row at most once (a user rates an item once)

    def scaled(self, scale: float) -> int:
        if self.cardinality <= MIN_SCALED_ROWS:
            return self.cardinality
        return max(MIN_SCALED_ROWS, int(round(self.cardinality * scale)))


@dataclass(frozen=True)
class Profile:
    """Shape of one public dataset."""

    name: str
    samples: int  # public size, for reference
    tables: tuple[TableSpec, ...]
    n_dense: int
    positive_rate: float
    context_zipf: float = 0.7
    contexts_per_row: float = 1 / 25  # contexts = rows * this
    sessions: int = 256
    session_length: float = 16.0
    stickiness: float = 0.0  # probability that a sample continues the previous sample's session
    revisit: float = 0.0  # probability that a new session returns to a recently ended session's context
    recent: int = 64  # how many recently ended sessions a revisit chooses from
    context_table: Optional[str] = None  # a table whose row is the context itself (the user)


def _tables(names, cardinalities, zipfs, couplings) -> tuple[TableSpec, ...]:
    return tuple(TableSpec(n, c, z, k) for n, c, z, k in zip(names, cardinalities, zipfs, couplings, strict=True))


# Criteo Kaggle (Display Advertising Challenge, 45.8M samples): 26 categorical
# features C1..C26 with the cardinalities used by DLRM, 13 integer features.
CRITEO_KAGGLE = Profile(
    name="criteo-kaggle", samples=45_840_617, n_dense=13, positive_rate=0.256,
    tables=_tables(
        [f"C{i}" for i in range(1, 27)],
        [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
         27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572],
        [1.10, 0.90, 1.05, 1.00, 1.20, 0.60, 1.10, 1.30, 0.20, 1.10, 0.90, 1.05, 1.00,
         0.50, 1.00, 1.00, 0.30, 1.10, 1.20, 0.10, 1.05, 0.80, 0.70, 1.10, 1.20, 1.10],
        [0.30, 0.20, 0.90, 0.85, 0.00, 0.00, 0.50, 0.10, 0.00, 0.70, 0.40, 0.90, 0.30,
         0.00, 0.60, 0.85, 0.00, 0.40, 0.30, 0.00, 0.90, 0.10, 0.00, 0.75, 0.20, 0.70],
    ),
)

# Avazu CTR (40.4M samples): 22 categorical columns after id and click.
AVAZU = Profile(
    name="avazu", samples=40_428_967, n_dense=0, positive_rate=0.170,
    tables=_tables(
        ["hour", "C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id",
         "app_domain", "app_category", "device_id", "device_ip", "device_model", "device_type",
         "device_conn_type", "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21"],
        [240, 7, 7, 4737, 7745, 26, 8552, 559, 36, 2686408, 6729486, 8251, 5, 4, 2626, 8, 9,
         435, 4, 68, 172, 60],
        [0.20, 1.20, 1.30, 1.20, 1.20, 1.10, 1.30, 1.30, 1.20, 1.10, 0.90, 1.00, 1.50, 1.00,
         1.00, 1.40, 1.40, 0.90, 0.80, 0.90, 0.90, 0.90],
        [0.00, 0.10, 0.30, 0.70, 0.70, 0.50, 0.70, 0.60, 0.50, 0.95, 0.95, 0.90, 0.80, 0.60,
         0.40, 0.10, 0.10, 0.40, 0.20, 0.30, 0.30, 0.30],
    ),
)

# MovieLens 25M (25.0M ratings): a user table and an item table. The user is
# the context itself and rates each item at most once, in runs, with returns
# within a few batches: the structure calibrated on MovieLens-100k (below).
# Its stickiness, revisit share and recent visits are taken from there (an
# assumption: ML-25m's own stream is not in the box); the item popularity
# keeps its long Zipf tail (no cutoff: ML-25m's catalogue has many rarely
# rated movies).
MOVIELENS_25M = Profile(
    name="movielens-25m", samples=25_000_095, n_dense=0, positive_rate=0.50,
    tables=(TableSpec("user", 162541, 0.80, 1.00), TableSpec("item", 59047, 1.10, 0.00, distinct=True)),
    session_length=40.0, sessions=64, stickiness=0.9, revisit=0.3, recent=128, context_table="user",
)

# Criteo Sponsored Search Conversion Log (15.99M samples): 17 categorical
# features, 2 numeric ones (nb_clicks_1week, product_price). Cardinalities are
# approximate public statistics of the released file.
CRITEO_SEARCH = Profile(
    name="criteo-search", samples=15_995_634, n_dense=2, positive_rate=0.134,
    tables=_tables(
        ["product_age_group", "device_type", "audience_id", "product_gender", "product_brand",
         "product_category1", "product_category2", "product_category3", "product_category4",
         "product_category5", "product_category6", "product_category7", "product_country",
         "product_id", "product_title", "partner_id", "user_id"],
        [11, 8, 18228, 17, 55983, 21, 170, 1061, 1363, 519, 175, 14, 23, 1628064, 820874,
         312, 5011950],
        [1.20, 1.40, 1.10, 1.20, 1.10, 1.00, 1.00, 1.00, 1.00, 1.00, 1.00, 0.90, 1.50,
         0.90, 0.90, 1.20, 0.60],
        [0.40, 0.80, 0.70, 0.40, 0.50, 0.40, 0.40, 0.40, 0.40, 0.40, 0.40, 0.30, 0.80,
         0.50, 0.50, 0.60, 0.95],
    ),
)

# MovieLens-100k (100,000 ratings by 943 users of 1,682 movies, in time order),
# calibrated on the real data (``data/ml-100k``; docs/data.md "Synthetic data" has the
# side-by-side table and ``hybrid.data.calibration`` the check). The user is
# the context. Structure found in the real data and modelled: about 3 users
# rate at once (``sessions``), in runs (90% of a user's ratings directly
# follow the same user's previous one: ``stickiness``), about 48 ratings per
# visit (about 2,000 visits), 30% of visits are returns within a few batches
# (``revisit`` among the last 128 visits), and no user rates a movie twice
# (``distinct``). Item popularity is a Zipf head with an exponential tail
# (``zipf`` 0.3, ``cutoff`` 0.2); user popularity is mild (``zipf`` 0.3). The
# real items show no popularity drift over the 7 months (the share of a
# batch's items seen 1 or 64 batches later is the same, 63%), so none is
# modelled. Use ``--rows 100000 --scale 1``.
MOVIELENS_100K = Profile(
    name="movielens-100k", samples=100_000, n_dense=0, positive_rate=0.554,
    tables=(TableSpec("user_id", 943, 0.30, 1.00),
            TableSpec("item_id", 1682, 0.30, 0.00, cutoff=0.2, distinct=True)),
    sessions=3, session_length=48.0, stickiness=0.9, revisit=0.3, recent=128, context_table="user_id",
)

PROFILES = {p.name: p for p in (CRITEO_KAGGLE, AVAZU, MOVIELENS_25M, CRITEO_SEARCH, MOVIELENS_100K)}


def popularity(n: int, exponent: float, cutoff: float = 0.0) -> np.ndarray:
    """Unnormalised popularity of rows 0..n-1: ``(k + 1) ** -exponent``, times an exponential tail if ``cutoff``."""
    k = np.arange(n, dtype=np.float64)
    weights = (k + 1) ** -exponent
    if cutoff > 0:
        weights *= np.exp(-k / (cutoff * n))
    return weights


def zipf_cdf(n: int, exponent: float, cutoff: float = 0.0) -> np.ndarray:
    """CDF of P(k) proportional to :func:`popularity` over k = 0..n-1."""
    cdf = np.cumsum(popularity(n, exponent, cutoff))
    cdf /= cdf[-1]
    return cdf


def distinct_rows(seed: int, stream: int, weights: np.ndarray, contexts: np.ndarray,
                  occurrences: np.ndarray) -> np.ndarray:
    """Row of each sample when a context never takes a row twice.

    Each context has its own random order of the rows, weighted by popularity
    (Efraimidis-Spirakis: sort by ``Exp(1) / weight``, keys hashed from
    (seed, context, row)); a context's k-th sample takes the k-th row of it
    (wrapping after all rows). Depends only on (context, k): chunk-independent.
    """
    n = len(weights)
    unique, inverse = np.unique(contexts, return_inverse=True)
    rows = np.empty(len(contexts), dtype=np.int64)
    block = max(1, (1 << 22) // n)  # contexts per (block x n) key matrix: about 32 MB of keys
    columns = np.arange(n, dtype=np.uint64)
    for first in range(0, len(unique), block):
        ctx = unique[first:first + block].astype(np.uint64)
        keys = -np.log1p(-uniform3(seed, stream, ctx[:, None] * np.uint64(n) + columns)) / weights
        order = np.argsort(keys, axis=1, kind="stable")
        inside = (inverse >= first) & (inverse < first + len(ctx))
        rows[inside] = order[inverse[inside] - first, occurrences[inside] % n]
    return rows


def _normal(seed: int, stream: int, counter: np.ndarray) -> np.ndarray:
    """Standard normal draws (Box-Muller on two hashed uniforms)."""
    u1 = uniform3(seed, stream, counter)
    u2 = uniform3(seed, stream ^ 0x5DEECE66D, counter)
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * math.pi * u2)


class SyntheticGenerator:
    """Draws samples of a profile chunk by chunk; see the module docstring."""

    def __init__(self, profile: Profile, *, rows: int, scale: float, seed: int = 0):
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        if scale <= 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        self.profile, self.rows, self.scale, self.seed = profile, rows, scale, seed
        self.cardinalities = [t.scaled(scale) for t in profile.tables]
        self._weights = [popularity(n, t.zipf, t.cutoff) for n, t in zip(self.cardinalities, profile.tables)]
        self._cdfs = [zipf_cdf(n, t.zipf, t.cutoff) for n, t in zip(self.cardinalities, profile.tables)]
        names = [t.name for t in profile.tables]
        if profile.context_table is not None and profile.context_table not in names:
            raise ValueError(f"context_table {profile.context_table!r} is not a table of {profile.name}")
        self._context_table = names.index(profile.context_table) if profile.context_table else None
        if self._context_table is None:
            context_cdf = zipf_cdf(max(16, int(rows * profile.contexts_per_row)), profile.context_zipf)
        else:
            context_cdf = self._cdfs[self._context_table]
        self._contexts = SessionProcess(
            seed=seed, n_active=profile.sessions, mean_length=profile.session_length, context_cdf=context_cdf,
            stickiness=profile.stickiness, revisit=profile.revisit, recent=profile.recent)
        n_tables = len(profile.tables)
        self._weight_scale = 1.2 / math.sqrt(max(1, n_tables))
        context_scale, dense_scale = 0.8, 0.3
        variance = 1.44 + context_scale**2 + profile.n_dense * dense_scale**2
        self._context_scale, self._dense_scale = context_scale, dense_scale
        # mean(sigmoid(N(b, v))) ~ sigmoid(b / sqrt(1 + pi v / 8)): pick b for the positive rate.
        p = profile.positive_rate
        self._bias = math.log(p / (1 - p)) * math.sqrt(1 + math.pi * variance / 8)

    def chunk(self, start: int, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Samples ``start .. start + size``; chunks must be requested in order."""
        if start != self._contexts.position:
            raise ValueError(f"chunks must be consecutive: expected start {self._contexts.position}, got {start}")
        seed = self.seed
        positions = np.arange(start, start + size, dtype=np.uint64)
        contexts, occurrences = self._contexts.take_counted(size)
        contexts = contexts.astype(np.uint64)
        sparse = np.empty((size, len(self._cdfs)), dtype=np.int32)
        logit = np.full(size, self._bias)
        for t, spec in enumerate(self.profile.tables):
            ids = self._table_rows(t, spec, positions, contexts, occurrences)
            sparse[:, t] = ids
            logit += self._weight_scale * _normal(seed, stream_id("weight", t), ids.astype(np.uint64))
        logit += self._context_scale * _normal(seed, stream_id("propensity"), contexts)
        dense = np.empty((size, self.profile.n_dense), dtype=np.float32)
        for j in range(self.profile.n_dense):
            z = 0.6 * _normal(seed, stream_id("dense-context", j), contexts) + \
                0.8 * _normal(seed, stream_id("dense", j), positions)
            counts = np.floor(np.exp(1.0 + 0.25 * (j % 3) + 1.2 * z))
            dense[:, j] = np.log1p(counts)
            logit += self._dense_scale * z
        labels = (uniform3(seed, stream_id("label"), positions) < 1 / (1 + np.exp(-logit))).astype(np.float32)
        return sparse, dense, labels

    def _table_rows(self, t: int, spec: TableSpec, positions: np.ndarray, contexts: np.ndarray,
                    occurrences: np.ndarray) -> np.ndarray:
        """Row ids of table ``t``: the context itself, its next distinct row, or a (coupled) popularity draw."""
        seed, cdf = self.seed, self._cdfs[t]
        if t == self._context_table:
            return contexts.astype(np.int64)
        if spec.distinct:
            return distinct_rows(seed, stream_id("distinct", t), self._weights[t], contexts, occurrences)
        coupled = uniform3(seed, stream_id("couple", t), positions) < spec.coupling
        u = np.where(coupled, uniform3(seed, stream_id("context-row", t), contexts),
                     uniform3(seed, stream_id("row", t), positions))
        return np.minimum(np.searchsorted(cdf, u, side="right"), len(cdf) - 1)


def synthesize(out_dir: str | Path, *, like: str, rows: int, scale: float, seed: int = 0,
               recurrence: Optional[dict] = None, force: bool = False,
               progress: Optional[Callable[[int], None]] = None) -> dict:
    """Write a synthetic store shaped like ``like``; returns its meta.

    ``recurrence`` replaces the profile's ``stickiness``, ``revisit`` and
    ``recent``: the MovieLens-calibrated recurrence can be tried on a profile
    whose real stream is not available (docs/data.md, "Synthetic data").
    """
    if like not in PROFILES:
        raise ValueError(f"unknown profile {like!r}; expected one of {sorted(PROFILES)}")
    recurrence = recurrence or {}
    unknown = set(recurrence) - {"stickiness", "revisit", "recent"}
    if unknown:
        raise ValueError(f"recurrence: unknown settings {sorted(unknown)}; expected stickiness, revisit, recent")
    profile = dataclasses.replace(PROFILES[like], **recurrence)
    generator = SyntheticGenerator(profile, rows=rows, scale=scale, seed=seed)
    source = {"kind": "synthetic", "like": like, "rows": rows, "scale": scale, "seed": seed, **recurrence}
    with StoreWriter(out_dir, n_samples=rows, table_names=[t.name for t in profile.tables],
                     n_dense=profile.n_dense, source=source, force=force) as writer:
        for start in range(0, rows, CHUNK):
            size = min(CHUNK, rows - start)
            writer.append(*generator.chunk(start, size))
            if progress is not None:
                progress(size)
        return writer.commit(generator.cardinalities)

