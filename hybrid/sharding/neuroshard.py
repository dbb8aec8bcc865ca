"""The NeuroShard planner: pre-trained cost models, then search (docs/design.md section 8).

``plan`` turns a task (each table's cardinality and the ids sample
iterations read from it) into a :class:`hybrid.runtime.shard_plan.ShardPlan`:
:func:`hybrid.sharding.search.neuroshard_search` proposes column splits, row
deals and placements, asking the cost models of
:mod:`hybrid.sharding.cost_models` (trained on :mod:`hybrid.sharding.cost_data`'s
measurements) what each rank's slices cost.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from hybrid.runtime.shard_plan import Columns, ShardPlan
from hybrid.sharding.cost_models import CostModels, table_slice
from hybrid.sharding.search import SearchResult, neuroshard_search


def slice_maker(cardinalities, ids, dim: int):
    """``slices(t, split)``: table ``t``'s slices under ``split``, their features measured once on ``ids``."""
    made: dict = {}

    def slices(t: int, split) -> list:
        kind, parts = split
        if (t, kind, parts) not in made:
            width = dim // parts if kind == "columns" else dim
            made[t, kind, parts] = [
                table_slice(ids[t], int(cardinalities[t]), table=t, width=width,
                            part=("whole", 1, 0) if kind == "whole" else (kind, parts, j))
                for j in range(parts)]
        return made[t, kind, parts]
    return slices


def placements_of(result: SearchResult) -> list:
    """The search's placements as :meth:`ShardPlan.from_tables` takes them."""
    out = []
    for where in result.placements:
        if isinstance(where, dict) and "columns" in where:
            out.append(Columns(tuple(int(s) for s in where["columns"])))
        elif isinstance(where, dict):
            out.append([int(s) for s in where["rows"]])
        else:
            out.append(int(where))
    return out


MIN_GAIN = 0.15  # a split must be predicted to save 15%, near the serving model's held-out error (0.19-0.27)


def plan(cardinalities, ids, n_shards: int, dim: int, models: CostModels, *, cap_rows: Optional[int] = None,
         min_gain: float = MIN_GAIN, **search) -> tuple[ShardPlan, SearchResult]:
    """The cost-model planner's plan for the tables, and the search's account (cost, evaluations, time)."""
    result = neuroshard_search(
        len(cardinalities), n_shards, dim, slices=slice_maker(cardinalities, ids, dim),
        serving=lambda sets: models.serving_ms_many(sets).tolist(), comm=models.comm_ms, cap_rows=cap_rows,
        min_gain=min_gain, **search)
    offsets = [0, *np.cumsum(np.asarray(cardinalities, dtype=np.int64)).tolist()]
    return ShardPlan.from_tables(offsets, placements_of(result), n_shards, "neuroshard", dim=dim), result


def account(result: SearchResult) -> dict:
    """What a search did, for reports: time, predicted cost, cost-model calls and the cache, the splits made."""
    calls = result.evaluations + result.cache_hits
    return {"search_seconds": round(result.seconds, 3), "predicted_ms": round(result.cost, 4),
            "evaluations": result.evaluations, "cache_hit_rate": round(result.cache_hits / calls, 3) if calls else 0.0,
            "splits": [[t, *split] for t, split in enumerate(result.splits) if split[0] != "whole"]}
