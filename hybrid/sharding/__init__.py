"""Sharding: planners that place embedding tables on PS ranks (docs/design.md section 8).

NeuroShard's pre-train-and-search (cost data measured through the real
store, cost models, beam and greedy grid search) and the baseline planners.
Each returns a ``hybrid.runtime.shard_plan.ShardPlan``, which training
loads with ``cluster.shard_plan``.

May import: ``hybrid._ext``, ``hybrid.counter_hash``, ``hybrid.data``,
``hybrid.config``, ``hybrid.runtime``.
"""
