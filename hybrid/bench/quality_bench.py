"""``hybrid bench quality``: LAIA's scheduling quality against brute force.

As the Herald paper's Appendix C: one sample per worker, so every balanced
allocation can be tried. From the state LAIA reached, each iteration's
cheapest allocation is found exhaustively; quality = brute-force
transmissions / LAIA transmissions (1.0 = optimal). The paper reports
0.45-0.57 for its heuristic.
"""
from __future__ import annotations

import numpy as np

from hybrid._ext.cluster_state import ClusterState
from hybrid.allocation import LaiaAllocation, RandomAllocation
from hybrid.brute_force import scheduling_quality
from hybrid.data.synthetic import PROFILES, SyntheticGenerator


POLICIES = ("laia", "laia-confident", "random")


def run(*, like: str = "criteo-kaggle", workers: int = 4, iterations: int = 100, scale: float = 0.0001,
        cache_ratio: float = 0.1, seed: int = 0) -> dict:
    """Quality of LAIA (the paper's order and the confident one) and of random allocation on ``iterations``
    batches of ``workers`` samples."""
    generator = SyntheticGenerator(PROFILES[like], rows=workers * iterations, scale=scale, seed=seed)
    sparse, _, _ = generator.chunk(0, workers * iterations)
    cardinalities = np.asarray(generator.cardinalities)
    offsets = np.concatenate([[0], np.cumsum(cardinalities)[:-1]])
    n_rows, n_tables = int(cardinalities.sum()), len(cardinalities)
    capacity = max(n_tables, int(n_rows * cache_ratio))
    batches = [np.ascontiguousarray(sparse[i * workers:(i + 1) * workers] + offsets, dtype=np.int64)
               for i in range(iterations)]
    result = {"like": like, "workers": workers, "iterations": iterations, "rows": n_rows, "capacity": capacity}
    for name in POLICIES:
        state = ClusterState(n_workers=workers, n_rows=n_rows, capacity=capacity, full_set=False,
                             max_pairs=workers * n_tables)
        policy = RandomAllocation(workers, seed) if name == "random" else \
            LaiaAllocation(state, seed, confident=name == "laia-confident")
        quality = scheduling_quality(state, policy, batches)
        result[name] = {"brute_force": quality.brute_force, "transmissions": quality.heuristic,
                        "quality": round(quality.ratio, 4)}
    return result
