"""Sharding tasks: sets of tables and the ids each iteration reads from them (docs/design.md section 8).

NeuroShard's tasks are tables drawn from a pool with their own sizes and
skews. Here the pool is the Criteo-like profile's 26 tables (cardinalities
at ``scale``, each with its own popularity skew, sessions and coupling) and
a batch is a batch of the synthetic generator, one id per table per sample.
The cost-data collector and ``hybrid bench sharding`` draw from the same
pool, so the cost models are trained on the distributions they plan for.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from hybrid.counter_hash import stream_id, uniform3
from hybrid.data.synthetic import CRITEO_KAGGLE, Profile, SyntheticGenerator


def task_profile(n_tables: int) -> Profile:
    """A task of ``n_tables`` tables drawn (with repeats) from the Criteo-like profile's, with their skews."""
    specs = CRITEO_KAGGLE.tables
    picks = (uniform3(0, stream_id("sharding-task", n_tables), np.arange(n_tables, dtype=np.uint64))
             * len(specs)).astype(np.int64)
    tables = tuple(replace(specs[p], name=f"{specs[p].name}-{k}") for k, p in enumerate(picks))
    return replace(CRITEO_KAGGLE, name=f"sharding-{n_tables}", tables=tables, n_dense=0)


def pool_profile() -> Profile:
    """The pool itself: the Criteo-like profile's 26 tables, each once."""
    return replace(CRITEO_KAGGLE, name="sharding-pool", n_dense=0)


def table_ids(profile: Profile, *, scale: float, batch: int, iterations: int, seed: int):
    """Each table's cardinality and, per table, the ids (table-local, with repeats) of each iteration."""
    generator = SyntheticGenerator(profile, rows=batch * iterations, scale=scale, seed=seed)
    sparse, _, _ = generator.chunk(0, batch * iterations)
    ids = [[np.ascontiguousarray(sparse[it * batch:(it + 1) * batch, t], dtype=np.int64) for it in range(iterations)]
           for t in range(sparse.shape[1])]
    return np.asarray(generator.cardinalities, dtype=np.int64), ids


def global_batches(cardinalities, ids) -> list[np.ndarray]:
    """Per iteration, the distinct global rows (tables one after another in the row space)."""
    offsets = np.concatenate([[0], np.cumsum(cardinalities)[:-1]])
    iterations = len(ids[0]) if ids else 0
    return [np.unique(np.concatenate([offsets[t] + ids[t][it] for t in range(len(ids))])) for it in range(iterations)]


def task_batches(n_tables: int, *, scale: float, batch: int, iterations: int, seed: int):
    """The task's table cardinalities and ``iterations`` batches of its distinct global rows."""
    cardinalities, ids = table_ids(task_profile(n_tables), scale=scale, batch=batch, iterations=iterations, seed=seed)
    return cardinalities, global_batches(cardinalities, ids)
