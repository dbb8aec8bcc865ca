"""Allocation policies: which worker trains each sample of a global batch.

Every policy is deterministic given (seed, iteration, batch, cluster state),
so every rank computes the same allocation without communicating. Workers
get ``|B| / n`` samples each (the first ``|B| mod n`` workers one more).
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod

import numpy as np

from hybrid._ext import laia
from hybrid.counter_hash import hash3, mix64, stream_id


def capacities(n_samples: int, n_workers: int) -> np.ndarray:
    """Samples per worker: as even as possible, remainder to the lowest ranks."""
    base, extra = divmod(n_samples, n_workers)
    return np.array([base + (w < extra) for w in range(n_workers)], dtype=np.int64)


def interleaved_slots(capacity: np.ndarray) -> np.ndarray:
    """Worker of each allocation slot, round-robin over workers (0, 1, .., n-1, 0, 1, ..).

    Cutting this sequence into consecutive pieces splits every worker's
    capacity evenly between the pieces (used for chunks and random order).
    """
    workers = np.repeat(np.arange(len(capacity), dtype=np.int32), capacity)
    ranks = np.concatenate([np.arange(c) for c in capacity]) if len(capacity) else np.zeros(0, np.int64)
    return workers[np.lexsort((workers, ranks))]


class AllocationPolicy(ABC):
    """Maps a global batch (global row ids, [B, tables]) to a worker per sample."""

    looks_ahead = False  # whether allocate() weighs the batch after ``rows`` (the multi-batch look-ahead)

    @property
    def reads_ahead(self) -> bool:
        """Whether allocate() wants the batch after ``rows`` (the scheduler then reads one batch early)."""
        return self.looks_ahead

    def __init__(self, n_workers: int):
        self.n_workers = n_workers
        self.timing = {"scoring": 0.0, "allocation": 0.0}

    @abstractmethod
    def allocate(self, rows: np.ndarray, iteration: int, upcoming: np.ndarray | None = None) -> np.ndarray:
        """int32 worker of each sample of ``rows``; ``upcoming``: the next batch's rows, if known.

        It gives no worker more than :meth:`largest_share` samples: the
        caches are sized for that before the first batch, and the scheduler
        checks it on every batch.
        """

    @classmethod
    def largest_share(cls, n_samples: int, n_workers: int) -> int:
        """The most samples :meth:`allocate` gives one worker of a batch of ``n_samples``.

        Every policy here balances (``capacities``): the batch per worker,
        rounded up. A policy that may give a worker more overrides this,
        and start-up sizes the caches for it (``cache_capacity``).
        """
        return -(-n_samples // n_workers)

    def save_arrays(self) -> dict:
        """What the policy carries from batch to batch, for a checkpoint (none: it reads the cluster state)."""
        return {}

    def load_arrays(self, arrays: dict) -> None:
        """Restore :meth:`save_arrays`."""


class RandomAllocation(AllocationPolicy):
    """A seeded random balanced assignment (vanilla BSP and the 'plan' mode)."""

    def __init__(self, n_workers: int, seed: int):
        super().__init__(n_workers)
        self.seed = seed
        self._slots: dict[int, np.ndarray] = {}  # batch size -> interleaved slots
        self._stream = stream_id("random-allocation")

    def allocate(self, rows: np.ndarray, iteration: int, upcoming: np.ndarray | None = None) -> np.ndarray:
        start = time.perf_counter()
        n = len(rows)
        if n not in self._slots:
            self._slots[n] = interleaved_slots(capacities(n, self.n_workers))
        stream = int(mix64(np.uint64(self._stream) ^ np.uint64(iteration)))  # = stream_id("random-allocation", it)
        keys = hash3(self.seed, stream, np.arange(n, dtype=np.uint64))
        alloc = np.empty(n, dtype=np.int32)
        alloc[np.argsort(keys, kind="stable")] = self._slots[n]
        self.timing = {"scoring": 0.0, "allocation": time.perf_counter() - start}
        return alloc


class ContiguousAllocation(AllocationPolicy):
    """Consecutive shards of the batch per worker (HET-style data parallelism)."""

    def allocate(self, rows: np.ndarray, iteration: int, upcoming: np.ndarray | None = None) -> np.ndarray:
        return np.repeat(np.arange(self.n_workers, dtype=np.int32), capacities(len(rows), self.n_workers))


class LaiaAllocation(AllocationPolicy):
    """Herald's LAIA: each sample to the worker holding most of its rows fresh.

    ``chunks=None`` runs the paper's exact sequential Algorithm 1; an integer
    runs the chunked lock-free variant (deterministic for a chunk count,
    whatever ``threads``). ``tables`` restricts scoring to a subset of tables
    (adaptive LAIA chooses it). ``confident`` takes the samples by margin
    (:func:`laia.margin_order`) instead of in batch order. ``cost`` places each
    sample where it adds the fewest transmissions given the samples placed
    before it (``laia.allocate_cost``) instead of where most of its rows are
    fresh; ``full_set`` says every trained row is pushed (mode laia). With
    cost scoring, ``swap_rounds`` refines the allocation by exchanges
    (``laia.swap_pass``) and ``lookahead`` allocates the batch in both
    orders and keeps the one that leaves the next batch cheaper too.
    ``blocks`` above 1 places cost scoring's samples in rounds of that many
    concurrent blocks of ``block_size`` (``laia.place_blocks``), so that the
    placement runs on the threads; the result depends on the two, never on ``threads``.
    """

    def __init__(self, state, seed: int, *, chunks: int | None = None, threads: int = 1, confident: bool = False,
                 cost: bool = False, full_set: bool = False, swap_rounds: int = 0, lookahead: bool = False,
                 blocks: int = 1, block_size: int = 32):
        super().__init__(state.n_workers)
        if (confident or cost) and chunks:
            raise ValueError("the confident order and cost scoring allocate the whole batch in one sequence: "
                             "they need unchunked LAIA")
        if (swap_rounds or lookahead) and not cost:
            raise ValueError("the swap pass and the look-ahead refine cost scoring's allocation: they need cost=True")
        if blocks < 1 or block_size < 1:
            raise ValueError(f"scheduler.blocks ({blocks}) and scheduler.block_size ({block_size}) must be at least 1")
        if blocks > 1 and not cost:
            raise ValueError("scheduler.blocks places cost scoring's samples in concurrent blocks: it needs "
                             "scheduler.scoring=cost (chunked LAIA is fresh scoring's parallel form)")
        if blocks > 1 and swap_rounds:
            raise ValueError("the swap pass follows one placement after another: scheduler.swap_rounds needs "
                             "scheduler.blocks=1")
        self.blocks, self.block_size = blocks, block_size
        self.state, self.seed, self.chunks, self.threads = state, seed, chunks, threads
        self.confident, self.cost, self.full_set, self.swap_rounds = confident, cost, full_set, swap_rounds
        self.looks_ahead = lookahead
        self.tables: np.ndarray | None = None
        self._layouts: dict[int, tuple] = {}  # batch size -> (capacity, chunk starts, chunk capacities)
        self._scratch = [laia.CostScratch(), laia.CostScratch()] if cost else None  # cost scoring's memory
        # With threads to spare, the next batch's distinct rows are found beside this batch's (serial) placement:
        # (its rows, its tables, its board), until allocate() gets that batch. Blocks place on every thread.
        self._prepares = cost and threads > 1 and not lookahead and blocks == 1
        self._prepared: tuple | None = None

    @property
    def reads_ahead(self) -> bool:
        return self.looks_ahead or self._prepares

    def allocate(self, rows: np.ndarray, iteration: int, upcoming: np.ndarray | None = None) -> np.ndarray:
        """Scoring is the confident order's margins; Algorithm 1 counts each sample's fresh rows as it
        places it, and cost scoring reads the holders (and its margins) itself: no [samples, workers] scores."""
        n = len(rows)
        start = time.perf_counter()
        tables = np.arange(rows.shape[1], dtype=np.int32) if self.tables is None else self.tables
        scoring = dict(holders=self.state.holder_words(), words=self.state.words, n_workers=self.n_workers,
                       rows=rows, tables=tables)
        gaps = laia.fresh_margins(threads=self.threads, **scoring) if self.confident and not self.cost else None
        scored = time.perf_counter()
        if n not in self._layouts:
            capacity = capacities(n, self.n_workers)
            self._layouts[n] = (capacity,) + (chunk_layout(n, capacity, self.chunks) if self.chunks else (None, None))
        capacity, starts, chunk_capacity = self._layouts[n]
        if self.cost:
            alloc = self._cost_allocation(rows, tables, capacity, iteration, upcoming)
        elif self.chunks is None:
            alloc = laia.allocate_exact(capacity=capacity, seed=self.seed, iteration=iteration,
                                        order=laia.margin_order(gaps) if self.confident else None, **scoring)
        else:
            alloc = laia.allocate_chunked(chunk_capacity=chunk_capacity, chunk_start=starts, seed=self.seed,
                                          iteration=iteration, threads=self.threads, **scoring)
        self.timing = {"scoring": scored - start, "allocation": time.perf_counter() - scored}
        return alloc

    def _cost_allocation(self, rows, tables, capacity, iteration: int, upcoming) -> np.ndarray:
        """Cost scoring's allocation; looking ahead, the better of both orders over this batch and the next."""
        common = dict(holders=self.state.holder_words(), words=self.state.words, n_workers=self.n_workers,
                      rows=rows, tables=tables, seed=self.seed, full_set=self.full_set)
        placing = dict(capacity=capacity, iteration=iteration, swap_rounds=self.swap_rounds, threads=self.threads,
                       scratch=self._scratch[0], blocks=self.blocks, block_size=self.block_size)
        alloc = laia.allocate_cost(confident=self.confident, **placing, **common, **self._boards(rows, tables, upcoming))
        if not self.looks_ahead or upcoming is None:
            return alloc
        other = laia.allocate_cost(confident=not self.confident, **placing, **common)
        if np.array_equal(alloc, other):
            return alloc
        following = capacities(len(upcoming), self.n_workers)
        costs = [laia.lookahead_cost(alloc=a, rows_next=upcoming, capacity_next=following,
                                     iteration_next=iteration + 1, scratch=self._scratch[0],
                                     scratch_next=self._scratch[1], **common) for a in (alloc, other)]
        return alloc if costs[0] <= costs[1] else other

    def _boards(self, rows, tables, upcoming) -> dict:
        """``board`` (this batch's, if prepared during the last call) and ``beside`` (the next batch's, to
        prepare now), each on a scratch of its own; nothing when not preparing.

        A prepared board serves only the very array it was made from, with
        the same tables (adaptive LAIA may change them between batches);
        any other call shapes its board anew, which gives the same
        allocation. The boards only save time: the result never depends on them.
        """
        if not self._prepares:
            return {}
        prepared, self._prepared = self._prepared, None
        boards = {}
        if prepared is not None and prepared[0] is rows and np.array_equal(prepared[1], tables):
            boards["board"] = prepared[2]
            self._scratch.reverse()  # the prepared board holds the second scratch: it becomes this batch's
        if upcoming is not None and upcoming.shape[1] == rows.shape[1]:
            beside = laia.next_board(words=self.state.words, n_workers=self.n_workers, rows=upcoming, tables=tables,
                                     full_set=self.full_set, swap_rounds=self.swap_rounds, threads=self.threads,
                                     scratch=self._scratch[1])
            self._prepared = (upcoming, tables.copy(), beside)
            boards["beside"] = beside
        return boards


def chunk_layout(n_samples: int, capacity: np.ndarray, chunks: int) -> tuple[np.ndarray, np.ndarray]:
    """Sample boundaries of ``chunks`` chunks and each chunk's per-worker capacity."""
    chunks = max(1, min(chunks, n_samples))
    starts = np.array([c * n_samples // chunks for c in range(chunks + 1)], dtype=np.int64)
    slots = interleaved_slots(capacity)
    chunk_capacity = np.stack([np.bincount(slots[starts[c]:starts[c + 1]], minlength=len(capacity))
                               for c in range(chunks)]).astype(np.int64)
    return starts, chunk_capacity


class TableProfiler:
    """Per-row access counts and each table's degree of infrequency (DoI).

    A row seen less than once per global batch on average is *infrequent*:
    it is usually trained by one worker and stays fresh there, which is what
    LAIA exploits; frequent rows are needed by every worker anyway. A table's
    DoI is the share of its cached rows that are infrequent, so high-DoI
    tables are the ones worth scoring (docs/design.md section 4).
    """

    def __init__(self, cardinalities):
        cardinalities = np.asarray(cardinalities, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(cardinalities)[:-1]]).astype(np.int64)
        self.counts = np.zeros(int(cardinalities.sum()), dtype=np.int64)
        self.iterations = 0
        self._pending: list[np.ndarray] = []

    def observe(self, rows: np.ndarray) -> None:
        """Count one global batch (global row ids); folded into counts lazily."""
        self._pending.append(rows.ravel())
        self.iterations += 1

    def _fold(self) -> None:
        """Add the pending batches' accesses: work that follows the batches, not the tables."""
        if self._pending:
            rows, seen = np.unique(np.concatenate(self._pending), return_counts=True)
            self.counts[rows] += seen
            self._pending.clear()

    def degree_of_infrequency(self, cached_rows: np.ndarray) -> np.ndarray:
        """DoI of every table over ``cached_rows`` (global ids cached by any worker)."""
        self._fold()
        n_tables = len(self.offsets)
        table = np.searchsorted(self.offsets, cached_rows, side="right") - 1
        infrequent = (self.counts[cached_rows] < self.iterations).astype(np.float64)
        cached = np.bincount(table, minlength=n_tables)
        return np.bincount(table, weights=infrequent, minlength=n_tables) / np.maximum(cached, 1)


DOI_SAMPLE = 8192  # cache slots sampled to estimate each table's degree of infrequency


class AdaptiveLaiaAllocation(LaiaAllocation):
    """LAIA scoring only the ``k`` tables of highest DoI.

    ``k`` is fixed (``score_tables``) or the largest that fits ``budget_ms``
    at the measured scoring cost per table. The scheduler alone (the
    simulator) measures as it goes. Ranks measure different costs, so
    training fixes ``k`` before the first batch: every worker times scoring
    with :meth:`measure_cost_ms`, they agree on the slowest, and
    :meth:`fix_table_count` keeps the count that fits it (``hybrid.training.loop``).
    Which tables are scored is revised every ``profile_every`` batches, from
    the batches seen so far; it depends on the state only.
    """

    def __init__(self, state, seed: int, cardinalities, *, score_tables: int = 0, budget_ms: float = 0.0,
                 profile_every: int = 10, chunks: int | None = None, threads: int = 1, confident: bool = False,
                 cost: bool = False, full_set: bool = False, swap_rounds: int = 0, lookahead: bool = False,
                 blocks: int = 1, block_size: int = 32):
        super().__init__(state, seed, chunks=chunks, threads=threads, confident=confident, cost=cost,
                         full_set=full_set, swap_rounds=swap_rounds, lookahead=lookahead, blocks=blocks,
                         block_size=block_size)
        self.profiler = TableProfiler(cardinalities)
        self.n_tables = len(cardinalities)
        self.score_tables, self.budget_ms, self.profile_every = score_tables, budget_ms, profile_every
        self.cost_per_table_ms = 0.0
        self.doi = np.zeros(self.n_tables)
        self._doi_stream = stream_id("doi-sample")

    def _sampled_slots(self, iteration: int) -> np.ndarray:
        """``DOI_SAMPLE`` cache slots of all workers, drawn by counter hash (the same on every rank).

        DoI is a share over cached rows, so a uniform sample of slots
        estimates it at a cost that does not grow with the caches.
        """
        total = self.n_workers * self.state.capacity
        if total <= DOI_SAMPLE:
            return np.arange(total, dtype=np.int64)
        draws = hash3(self.seed, self._doi_stream, np.uint64(iteration) * np.uint64(DOI_SAMPLE)
                      + np.arange(DOI_SAMPLE, dtype=np.uint64))
        return (draws % np.uint64(total)).astype(np.int64)

    def save_arrays(self) -> dict:
        """The access counts, the tables chosen and the measured cost, so a resumed run chooses alike."""
        self.profiler._fold()
        tables = np.full(0, -1, np.int32) if self.tables is None else self.tables
        return {"counts": self.profiler.counts.copy(), "iterations": np.int64(self.profiler.iterations),
                "tables": tables, "has_tables": np.bool_(self.tables is not None), "doi": self.doi.copy(),
                "cost_per_table_ms": np.float64(self.cost_per_table_ms), "score_tables": np.int64(self.score_tables)}

    def load_arrays(self, arrays: dict) -> None:
        counts = np.asarray(arrays["counts"])
        if counts.shape != self.profiler.counts.shape:
            raise ValueError(f"saved access counts cover {counts.shape[0]} rows, the tables "
                             f"{self.profiler.counts.shape[0]}")
        tables = np.asarray(arrays["tables"], dtype=np.int32)
        if len(tables) and (tables.min() < 0 or tables.max() >= self.n_tables):
            raise ValueError(f"saved scored tables {tables.tolist()} are not tables of this store")
        self.profiler.counts[:] = counts
        self.profiler.iterations = int(arrays["iterations"])
        self.tables = tables if bool(arrays["has_tables"]) else None
        self.doi = np.asarray(arrays["doi"], dtype=np.float64).copy()
        self.cost_per_table_ms = float(arrays["cost_per_table_ms"])
        if "score_tables" in arrays:  # the count the run agreed on (older checkpoints: measured again)
            self.score_tables = int(arrays["score_tables"])

    def measure_cost_ms(self, rows: np.ndarray, repeats: int = 5) -> float:
        """Milliseconds per table to score ``rows`` on this rank: the median of ``repeats`` timings of every table.

        Reads the state only (no access is counted), so it changes no plan.
        """
        chosen, self.tables = self.tables, None
        costs = []
        for _ in range(repeats):
            LaiaAllocation.allocate(self, rows, 0)
            costs.append(1000 * self.scoring_seconds() / self.n_tables)
        self.tables = chosen
        return float(np.median(costs))

    def scoring_seconds(self) -> float:
        """The last batch's scoring cost: its allocation too, because Algorithm 1 counts each sample's
        fresh rows as it places it (the work that grows with the tables scored)."""
        return self.timing["scoring"] + self.timing["allocation"]

    def fix_table_count(self, cost_per_table_ms: float) -> int:
        """Score, from now on, the tables ``budget_ms`` affords at ``cost_per_table_ms`` (agreed by every rank)."""
        self.cost_per_table_ms = cost_per_table_ms
        self.score_tables = self.table_count()
        return self.score_tables

    def table_count(self) -> int:
        if self.score_tables:
            return min(self.score_tables, self.n_tables)
        if self.budget_ms <= 0 or self.cost_per_table_ms <= 0:
            return self.n_tables
        return int(np.clip(self.budget_ms // self.cost_per_table_ms, 1, self.n_tables))

    def allocate(self, rows: np.ndarray, iteration: int, upcoming: np.ndarray | None = None) -> np.ndarray:
        self.profiler.observe(rows)
        if iteration % self.profile_every == 0 and iteration > 0:
            cached = self.state.rows_at_slots(self._sampled_slots(iteration))
            self.doi = self.profiler.degree_of_infrequency(cached[cached >= 0])
            order = np.argsort(-self.doi, kind="stable")
            self.tables = np.sort(order[:self.table_count()]).astype(np.int32)
        alloc = super().allocate(rows, iteration, upcoming)
        scored = len(self.tables) if self.tables is not None else self.n_tables
        per_table = 1000 * self.scoring_seconds() / max(1, scored)
        self.cost_per_table_ms = per_table if not self.cost_per_table_ms else \
            0.9 * self.cost_per_table_ms + 0.1 * per_table
        return alloc
