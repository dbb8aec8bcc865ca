"""``hybrid bench quality``: LAIA's scheduling quality against brute force (paper Appendix C, Fig. 20).

As the Herald paper's Appendix C: one sample per worker, so every balanced
allocation can be tried. After ``warmup`` batches that fill the caches (the
paper's 10), each iteration's cheapest allocation is found exhaustively from
the state the policy reached; quality = brute-force transmissions / policy
transmissions (1.0 = optimal), for 2 to N workers. The paper reports 0.45 to
0.57 for its heuristic over 90 iterations.

Brute force tries ``workers!`` allocations per batch, each on a copy of the
state: here 7 workers take about 0.66 s per batch and policy, so 90 batches
of the three policies take about 3 minutes, and every further worker
multiplies that by about 7 to 8. The default stops at 6 workers (under a
minute in all); ``--workers`` goes further at that price.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from hybrid._ext.cluster_state import ClusterState
from hybrid.bench.result_files import deterministic_counts, finish, line_chart, markdown_table, pyplot
from hybrid.data.synthetic import PROFILES, SyntheticGenerator
from hybrid.scheduling.allocation import LaiaAllocation, RandomAllocation
from hybrid.scheduling.brute_force import scheduling_quality

NAME = "quality"
TITLE = "Scheduling quality against brute force (paper Appendix C, Fig. 20)"
# LaiaAllocation's settings per policy (None: random allocation)
POLICIES = {"laia": {}, "laia-confident": {"confident": True}, "laia-cost": {"cost": True},
            "laia-cost-confident": {"cost": True, "confident": True},
            "laia-cost-swap": {"cost": True, "confident": True, "swap_rounds": 2}, "random": None}
WORKERS = (2, 3, 4, 5, 6)
ITERATIONS, WARMUP = 90, 10  # the paper's: 90 iterations after 10 warm-ups
PAPER = {"appendix_c_quality_range": [0.45, 0.57], "appendix_c_herald_sched_ms_below": 0.7,
         "appendix_c_iterations": 90, "appendix_c_warmup": 10}
repeats_note = deterministic_counts


class _Shifted:
    """A policy seeing iteration ``t + offset``: after the warm-up, tie-breaking draws do not repeat its draws."""

    def __init__(self, policy, offset: int):
        self.policy, self.offset = policy, offset

    def allocate(self, rows: np.ndarray, iteration: int) -> np.ndarray:
        return self.policy.allocate(rows, iteration + self.offset)


def tiny_batches(like: str, workers: int, n_batches: int, scale: float, seed: int):
    """``n_batches`` batches of one sample per worker (global row ids), the row count and the tables."""
    generator = SyntheticGenerator(PROFILES[like], rows=workers * n_batches, scale=scale, seed=seed)
    sparse, _, _ = generator.chunk(0, workers * n_batches)
    cardinalities = np.asarray(generator.cardinalities)
    offsets = np.concatenate([[0], np.cumsum(cardinalities)[:-1]])
    batches = [np.ascontiguousarray(sparse[i * workers:(i + 1) * workers] + offsets, dtype=np.int64)
               for i in range(n_batches)]
    return batches, int(cardinalities.sum()), len(cardinalities)


def measure(*, workers: int, iterations: int = ITERATIONS, warmup: int = WARMUP, like: str = "criteo-kaggle",
            scale: float = 0.0001, cache_ratio: float = 0.1, seed: int = 0) -> dict:
    """Quality of each policy at one worker count, and the seconds the comparison took."""
    batches, n_rows, n_tables = tiny_batches(like, workers, warmup + iterations, scale, seed)
    capacity = max(n_tables, int(n_rows * cache_ratio))
    result = {"workers": workers, "iterations": iterations, "warmup": warmup, "rows": n_rows, "capacity": capacity}
    start = time.perf_counter()
    for name, settings in POLICIES.items():
        state = ClusterState(n_workers=workers, n_rows=n_rows, capacity=capacity, full_set=False,
                             max_pairs=workers * n_tables)
        policy = RandomAllocation(workers, seed) if settings is None else LaiaAllocation(state, seed, **settings)
        for t, rows in enumerate(batches[:warmup]):
            state.plan(rows, policy.allocate(rows, t))
            state.train()
        quality = scheduling_quality(state, _Shifted(policy, warmup), batches[warmup:])
        result[name] = {"brute_force": quality.brute_force, "transmissions": quality.heuristic,
                        "quality": round(quality.ratio, 4)}
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


def run(*, workers=WORKERS, iterations: int = ITERATIONS, warmup: int = WARMUP, like: str = "criteo-kaggle",
        scale: float = 0.0001, cache_ratio: float = 0.1, seed: int = 0, say=lambda line: None) -> dict:
    """:func:`measure` at each worker count."""
    points = []
    for n in workers:
        points.append(measure(workers=n, iterations=iterations, warmup=warmup, like=like, scale=scale,
                              cache_ratio=cache_ratio, seed=seed))
        say(f"{n} workers: {points[-1]['seconds']} s")
    return {"like": like, "scale": scale, "cache_ratio": cache_ratio, "policies": list(POLICIES), "paper": PAPER,
            "points": points}


def format_table(result: dict) -> str:
    lines = [f"{'workers':>8}{'rows':>7}{'slots':>7}" + "".join(f"{name:>16}" for name in result["policies"])
             + f"{'seconds':>9}"]
    for p in result["points"]:
        lines.append(f"{p['workers']:>8}{p['rows']:>7}{p['capacity']:>7}"
                     + "".join(f"{p[name]['quality']:>16.4f}" for name in result["policies"]) + f"{p['seconds']:>9.1f}")
    first = result["points"][0]
    return (f"brute-force / policy transmissions over {first['iterations']} batches of one sample per worker, "
            f"after {first['warmup']} warm-up\n" + "\n".join(lines))


def markdown(document: dict) -> str:
    result = document["result"]
    table = markdown_table(["workers", *result["policies"], "paper (Herald)"],
                           [[p["workers"], *(f"{p[name]['quality']:.3f}" for name in result["policies"]),
                             "figure only"] for p in result["points"]])
    low, high = PAPER["appendix_c_quality_range"]
    first = result["points"][0]
    return (f"Brute-force transmissions over the policy's (1.0 = optimal), {first['iterations']} batches of one "
            f"sample per worker after {first['warmup']} warm-up, synthetic {result['like']} at scale "
            f"{result['scale']}. The paper: {low} to {high} over its worker counts (per count: figure only). "
            f"Brute force multiplies its time by about the worker count with each worker, so the default stops "
            f"at {max(WORKERS)}.\n\n" + table)


def plot(document: dict, path: Path) -> None:
    """Quality against the worker count, one line per policy, the paper's range shaded."""
    plt = pyplot()
    result = document["result"]
    workers = [p["workers"] for p in result["points"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    line_chart(ax, workers, {name: [p[name]["quality"] for p in result["points"]] for name in result["policies"]},
               "workers (one sample each)", "brute force / policy transmissions")
    low, high = PAPER["appendix_c_quality_range"]
    ax.axhspan(low, high, color="tab:red", alpha=0.15, label="paper's Herald, all counts")
    ax.set_ylim(0, 1.05)
    ax.set_xticks(workers)
    ax.legend(fontsize=7)
    finish(fig, path, "hybrid bench quality")
