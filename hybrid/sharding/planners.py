"""Baseline shard planners: which PS rank holds each table (NeuroShard's baselines, docs/design.md section 8).

Every planner returns a :class:`hybrid.runtime.shard_plan.ShardPlan` for the store's
tables on ``n_shards`` PS ranks, and none exceeds ``cap_rows`` rows on a
rank (the memory cap, in rows of the embedding width). The table-wise ones
are NeuroShard's baselines: ``random``; greedy by a per-table cost, each
table (largest cost first) to the rank with the least cost so far that has
room: ``size`` (rows x dim), ``dim``, ``lookup`` (dim x pooling factor) and
``size-lookup`` (the two normalized and added). Two row-wise plans:
``row-ranges`` (contiguous ranges of the global row space, the default) and
``round-robin`` (every table's rows dealt over all ranks, so the hottest
rows, first in popularity order, spread evenly).

In this system every table has the model's one embedding width and one id
per sample (pooling factor 1), so ``dim`` and ``lookup`` assign tables
round-robin by count; they are kept because they are the paper's baselines.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from hybrid.counter_hash import hash3, stream_id
from hybrid.runtime.shard_plan import ShardPlan, ShardPlanError


def _offsets(cardinalities) -> list[int]:
    return [0, *np.cumsum(np.asarray(cardinalities, dtype=np.int64)).tolist()]


def greedy(cardinalities, n_shards: int, cost: np.ndarray, *, cap_rows: Optional[int], name: str) -> ShardPlan:
    """Tables by descending ``cost`` (ties: table order), each to the rank with least cost so far and room."""
    sizes = np.asarray(cardinalities, dtype=np.int64)
    load, rows = np.zeros(n_shards), np.zeros(n_shards, dtype=np.int64)
    cap = np.iinfo(np.int64).max if cap_rows is None else cap_rows
    placement = [0] * len(sizes)
    for t in sorted(range(len(sizes)), key=lambda t: (-cost[t], t)):
        fitting = [s for s in range(n_shards) if rows[s] + sizes[t] <= cap]
        if not fitting:
            raise ShardPlanError(f"{name}: table {t} ({sizes[t]} rows) fits on no PS rank under the cap of "
                                 f"{cap} rows (ranks hold {rows.tolist()})")
        shard = min(fitting, key=lambda s: (load[s], s))
        placement[t] = shard
        load[shard] += cost[t]
        rows[shard] += sizes[t]
    return ShardPlan.from_tables(_offsets(sizes), placement, n_shards, name)


def random_plan(cardinalities, n_shards: int, *, cap_rows: Optional[int], seed: int = 0) -> ShardPlan:
    """Each table to a seeded random rank among those with room (tables in order)."""
    sizes = np.asarray(cardinalities, dtype=np.int64)
    rows = np.zeros(n_shards, dtype=np.int64)
    cap = np.iinfo(np.int64).max if cap_rows is None else cap_rows
    draws = hash3(seed, stream_id("random-shard-plan"), np.arange(len(sizes), dtype=np.uint64))
    placement = []
    for t, size in enumerate(sizes):
        fitting = [s for s in range(n_shards) if rows[s] + size <= cap]
        if not fitting:
            raise ShardPlanError(f"random: table {t} ({size} rows) fits on no PS rank under the cap of {cap} rows")
        shard = fitting[int(draws[t] % np.uint64(len(fitting)))]
        placement.append(shard)
        rows[shard] += size
    return ShardPlan.from_tables(_offsets(sizes), placement, n_shards, "random")


def row_ranges(cardinalities, n_shards: int, *, cap_rows: Optional[int]) -> ShardPlan:
    """The default: contiguous ranges of the global row space."""
    return _capped(ShardPlan.contiguous(int(np.sum(cardinalities)), n_shards), cap_rows)


def round_robin(cardinalities, n_shards: int, *, cap_rows: Optional[int]) -> ShardPlan:
    """Every table's rows dealt over all ranks: row k of a table on rank k mod n_shards."""
    sizes = np.asarray(cardinalities, dtype=np.int64)
    placement = [list(range(min(n_shards, int(size)))) for size in sizes]
    return _capped(ShardPlan.from_tables(_offsets(sizes), placement, n_shards, "round-robin"), cap_rows)


def _capped(plan: ShardPlan, cap_rows: Optional[int]) -> ShardPlan:
    if cap_rows is not None and plan.shard_rows > cap_rows:
        raise ShardPlanError(f"{plan.name}: a PS rank would hold {plan.shard_rows} rows, over the cap of {cap_rows}")
    return plan


def table_costs(cardinalities, dim: int, pooling: float = 1.0) -> dict[str, np.ndarray]:
    """NeuroShard's per-table costs of the greedy baselines."""
    sizes = np.asarray(cardinalities, dtype=np.float64)
    size = sizes * dim
    lookup = np.full(len(sizes), dim * pooling)
    return {"size": size, "dim": np.full(len(sizes), float(dim)), "lookup": lookup,
            "size-lookup": size / max(size.sum(), 1.0) + lookup / max(lookup.sum(), 1.0)}


PLANNERS = ("row-ranges", "round-robin", "random", "size", "dim", "lookup", "size-lookup")


def make_plan(name: str, cardinalities, n_shards: int, *, dim: int, cap_rows: Optional[int] = None,
              seed: int = 0) -> ShardPlan:
    """The plan of baseline ``name`` (one of :data:`PLANNERS`)."""
    row_wise: dict[str, Callable] = {"row-ranges": row_ranges, "round-robin": round_robin}
    if name in row_wise:
        return row_wise[name](cardinalities, n_shards, cap_rows=cap_rows)
    if name == "random":
        return random_plan(cardinalities, n_shards, cap_rows=cap_rows, seed=seed)
    costs = table_costs(cardinalities, dim)
    if name not in costs:
        raise ShardPlanError(f"unknown planner {name!r}; expected one of {', '.join(PLANNERS)}")
    return greedy(cardinalities, n_shards, costs[name], cap_rows=cap_rows, name=name)


def shard_load(plan: ShardPlan, batches) -> np.ndarray:
    """Mean distinct rows each PS rank serves per global batch (global row ids), over ``batches``
    (a row whose columns are sliced over ranks counts on each of them).

    Each distinct row a batch needs is read from (and its update written to)
    its rank at most about once per iteration, so this is the rows each rank
    serves: the slowest rank sets the pace.
    """
    total = np.zeros(plan.n_shards)
    n = 0
    for rows in batches:
        total += np.bincount(plan.pieces(np.unique(rows), max(plan.dim, 1))[1], minlength=plan.n_shards)
        n += 1
    return total / max(1, n)
