"""A run's work per iteration as the time model reads it (``time_model.Load``), from the simulator's events.

The scheduler runs over the run's global batches as ``hybrid simulate``
runs it; after each of its state's calls (``train``, then ``plan``, whose
plan pushes the same iteration executes) every worker's events are sorted
into the stages the loop executes them in (docs/design.md section 11):

- ``pull``: pulls, the early ones (rows the previous iteration did not
  write) read a whole iteration ahead when ``train.overlap`` is on;
  write-backs; HET's version checks; rows received from peers.
- ``push``: accumulates, full-set and plan pushes; HET's delta pushes and
  evicted deltas (each with its version counts: one more operation); and
  every trained row's update in the cache (one update event per trained
  row and worker).

An operation counts once per PS rank its rows reach (the store sends one
per rank). Each stage's figures are the maximum over the workers (or the PS
ranks) of that iteration, averaged over the iterations after the warm-up.

FAE: its cold strips are vanilla's events; a hot iteration moves no row
through the PS, updates the batch's hot rows (their union) in every
worker's replica and sums their gradients in a second allreduce; a switch
between strips reads the replica into every worker, or has worker 0 write
it to the PS, in the pull stage (``hybrid.modes.fae``), and a new pair of
strips first measures the held-out loss (``fae.heldout_samples``).
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from hybrid import modes
from hybrid._ext.cluster_state import KIND_NAMES, UPDATE_KINDS
from hybrid.config import Config, Mode
from hybrid.data.store import BatchStore
from hybrid.projection.time_model import Load
from hybrid.runtime.shard_plan import ShardPlan
from hybrid import wire_format

KIND = {name: k for k, name in enumerate(KIND_NAMES)}
ID_BYTES = 8  # a row id travels with the row (the packed transport's ids; the datatype's offsets)
# one store operation each; HET's pushes of deltas also add their version counts (a second operation)
PUSH_OPERATIONS = (("accumulate",), ("full_set_push",), ("plan_push",), ("delta_push",), ("delta_push",),
                   ("delta_writeback",), ("delta_writeback",))


@dataclass
class _Sums:
    """Running sums of each ``Load`` field over the iterations counted."""

    iterations: int = 0
    totals: dict = field(default_factory=dict)

    def add(self, figures: dict) -> None:
        self.iterations += 1
        for key, value in figures.items():
            self.totals[key] = self.totals.get(key, 0.0) + float(value)

    def mean(self) -> dict:
        return {key: value / self.iterations for key, value in self.totals.items()}


class _Iteration:
    """Every worker's events of one iteration (train, then plan), sorted into stages."""

    def __init__(self, n_workers: int, shards: ShardPlan, overlap: bool):
        self.n_workers, self.shards, self.overlap = n_workers, shards, overlap
        self.parts: list = []

    def observe(self, state) -> None:
        kind, worker, row, _ = state.events()
        self.parts.append((kind, worker, row, state.prefetchable()))

    def _events(self):
        kind, worker, row, early = (np.concatenate(x) for x in zip(*self.parts))
        return kind, worker, row, early

    def _per_worker(self, mask, worker) -> np.ndarray:
        return np.bincount(worker[mask], minlength=self.n_workers)

    def _per_shard(self, mask, row) -> np.ndarray:
        return np.bincount(self.shards.shard_of(row[mask]), minlength=self.shards.n_shards)

    def _ops(self, masks, worker, row) -> np.ndarray:
        """Operations per worker: for each operation, the PS ranks its rows reach."""
        ops = np.zeros(self.n_workers, dtype=np.int64)
        for mask in masks:
            if mask.any():
                pairs = np.unique(worker[mask].astype(np.int64) * self.shards.n_shards
                                  + self.shards.shard_of(row[mask]))
                ops += np.bincount(pairs // self.shards.n_shards, minlength=self.n_workers)
        return ops

    def figures(self, allocation: np.ndarray) -> dict:
        kind, worker, row, early = self._events()
        of = lambda *names: np.isin(kind, [KIND[n] for n in names])  # noqa: E731
        pulls = of("pull")
        ahead = pulls & early.astype(bool) if self.overlap else np.zeros_like(pulls)
        blocking = pulls & ~ahead
        groups = {"pull": blocking, "writeback": of("writeback"), "check": of("version_check"),
                  "prefetch": ahead, "push": of(*{n for op in PUSH_OPERATIONS for n in op})}
        figures = {"samples": np.bincount(allocation, minlength=self.n_workers).max(),
                   "p2p_rows": self._per_worker(of("p2p"), worker).max(),
                   "update_rows": self._per_worker(of(*UPDATE_KINDS), worker).max()}
        for name, mask in groups.items():
            figures[f"{name}_rows"] = self._per_worker(mask, worker).max()
            figures[f"ps_{name}_rows"] = self._per_shard(mask, row).max()
        figures["pull_ops"] = self._ops([blocking, ahead, of("writeback"), of("version_check")], worker, row).max()
        figures["push_ops"] = self._ops([of(*op) for op in PUSH_OPERATIONS], worker, row).max()
        self.parts = []
        return figures


def _fae_figures(plan, iteration: _Iteration, hot_rows: np.ndarray, config: Config) -> dict:
    """One FAE iteration's figures: a cold one's events (``iteration``) or a hot one's replica work, and the
    switch that precedes it (docs/design.md section 7)."""
    if plan.fae.kind == "cold":
        figures = iteration.figures(plan.allocation)
    else:
        union = plan.counts["hot_allreduce"]
        gradient_bytes = config.model.embedding_dim * np.dtype(config.model.precision.value).itemsize
        figures = {"samples": np.bincount(plan.allocation, minlength=iteration.n_workers).max(),
                   "update_rows": union, "hot_allreduces": 1, "hot_allreduce_bytes": union * gradient_bytes}
    fae, shards = plan.fae, iteration.shards
    per_shard = np.bincount(shards.shard_of(hot_rows), minlength=shards.n_shards)
    reached = int((per_shard > 0).sum())  # one operation per PS rank the hot rows are on
    switch: dict = {}
    if fae.push_replicas:  # worker 0 writes every hot row
        switch.update(writeback_rows=len(hot_rows), ps_writeback_rows=per_shard.max(), pull_ops=reached)
    if fae.pull_replicas:  # every worker reads every hot row (a strip never both pushes and pulls)
        switch.update(pull_rows=len(hot_rows), ps_pull_rows=per_shard.max() * iteration.n_workers,
                      pull_ops=switch.get("pull_ops", 0) + reached)
    if fae.observe is not None:
        switch["eval_samples"] = config.fae.heldout_samples
    return {key: figures.get(key, 0) + switch.get(key, 0) for key in {**figures, **switch}}


def row_bytes(config: Config) -> int:
    """A row on the wire: its values as they travel (optimizer state included; 2 bytes a value with a 16-bit
    ``cluster.wire_precision``) and its id."""
    return wire_format.row_bytes(config) + ID_BYTES


@dataclass(frozen=True)
class RunLoad:
    """What a run asks of each iteration: its mean ``Load``, over how many iterations, and its worker's
    scheduler's milliseconds per global batch on this machine (the plans alone, as a worker makes them)."""

    load: Load
    iterations: int
    schedule_ms: float


def loads(config: Config, store: BatchStore, mode: Mode, *, iterations: int = 0, mlp_bytes: float = 0.0,
          shards: Optional[ShardPlan] = None) -> RunLoad:
    """The mean ``Load`` of ``mode``'s run of ``config`` over the iterations after the warm-up.

    ``shards``: the PS layout (default: the run's contiguous one); ``mlp_bytes``: the MLP's gradients.
    The scheduler runs as worker 0's does (its plans and the marks of what may be read ahead); the time
    spent reading the events out is not counted in ``schedule_ms``.
    """
    length = iterations or modes.run_length(config, store)
    n_rows = int(store.cardinalities.sum())
    shards = shards or ShardPlan.contiguous(n_rows, config.cluster.ps)
    scheduler, batches = modes.get(mode).simulation(config, store, length, worker=0)  # worker: early pulls marked
    iteration = _Iteration(config.cluster.workers, shards, config.train.overlap)
    observing = [0.0]

    def observe(call: str) -> None:
        start = time.perf_counter()
        iteration.observe(scheduler.state)
        observing[0] += time.perf_counter() - start

    fae = mode is Mode.fae
    (scheduler.cold if fae else scheduler).observe = observe  # FAE: its cold strips' scheduler
    sums, scheduling = _Sums(), 0.0
    plans = scheduler.plans(itertools.islice(batches, length))
    while True:
        observing[0], start = 0.0, time.perf_counter()
        plan = next(plans, None)
        seconds = time.perf_counter() - start - observing[0]
        if plan is None:
            break
        figures = _fae_figures(plan, iteration, scheduler.hot_rows, config) if fae \
            else iteration.figures(plan.allocation)
        if plan.step >= config.scheduler.warmup_iterations:
            sums.add(figures)
            scheduling += seconds
    if not sums.iterations:
        raise ValueError(f"no iteration after scheduler.warmup_iterations={config.scheduler.warmup_iterations} "
                         f"in {length}: use more data or a shorter warm-up")
    load = Load(row_bytes=row_bytes(config), mlp_bytes=mlp_bytes, **sums.mean())
    return RunLoad(load, sums.iterations, 1e3 * scheduling / sums.iterations)
