"""``hybrid bench scheduler``: time per global batch of each scheduling stage.

Herald mode (LAIA + on-demand plans) on Criteo-like synthetic data: scoring,
allocation, cluster-state update and plan, per global batch, as a worker's
scheduler thread runs them (with the prefetch marks, the event digest and
the worker's share of each plan), for several
worker counts, thread counts and LAIA variants, measured side by side in one
run. The paper reports 7.7 ms per batch with 16 threads (scoring 3.2 ms,
allocation 0.6 ms); the goal here is at most 1 ms for 8 workers on one thread.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from hybrid.config import load_config
from hybrid.data.synthetic import CRITEO_KAGGLE, SyntheticGenerator
from hybrid.scheduler import Scheduler

STAGES = ("scoring", "allocation", "state_update", "plan")


@dataclass
class BenchRow:
    workers: int
    batch_per_worker: int
    threads: int
    laia: str
    iterations: int
    ms: dict  # stage -> mean milliseconds per global batch

    @property
    def total_ms(self) -> float:
        return sum(self.ms.values())

    def to_dict(self) -> dict:
        return {"workers": self.workers, "batch_per_worker": self.batch_per_worker, "threads": self.threads,
                "laia": self.laia, "iterations": self.iterations,
                **{f"{k}_ms": round(v, 4) for k, v in self.ms.items()}, "total_ms": round(self.total_ms, 4)}


def synthetic_batches(n_samples: int, scale: float, seed: int = 0):
    """Criteo-like per-table ids for ``n_samples`` samples, and the table cardinalities."""
    generator = SyntheticGenerator(CRITEO_KAGGLE, rows=n_samples, scale=scale, seed=seed)
    sparse, _, _ = generator.chunk(0, n_samples)
    return sparse, np.asarray(generator.cardinalities)


def run_case(sparse, cardinalities, *, workers: int, batch_per_worker: int, threads: int, laia: str,
             iterations: int, warmup: int, cache_ratio: float) -> BenchRow:
    config = load_config(None, [f"cluster.workers={workers}", f"train.batch_per_worker={batch_per_worker}",
                                f"scheduler.threads={threads}", f"scheduler.laia={laia}", "scheduler.mode=herald",
                                f"scheduler.chunks={max(8, threads * 4)}", f"cache.ratio={cache_ratio}"])
    batch = config.global_batch
    scheduler = Scheduler.from_config(config, cardinalities=cardinalities, worker=0)  # as a worker runs it
    batches = (sparse[(i * batch) % (len(sparse) - batch + 1):][:batch] for i in range(warmup + iterations))
    totals = dict.fromkeys(STAGES, 0.0)
    for plan in scheduler.plans(batches):
        if plan.step >= warmup:
            for stage in STAGES:
                totals[stage] += plan.timing[stage]
    return BenchRow(workers, batch_per_worker, threads, laia, iterations,
                    {k: 1000 * v / iterations for k, v in totals.items()})


def run(*, workers=(8, 16, 64, 128), threads=(1, 2), batch_per_worker=(128,), laia=("exact", "chunked"),
        iterations: int = 30, warmup: int = 10, scale: float = 0.01, cache_ratio: float = 0.1,
        progress=None) -> list[BenchRow]:
    largest = max(workers) * max(batch_per_worker) * (warmup + iterations)
    start = time.perf_counter()
    sparse, cardinalities = synthetic_batches(min(largest, 2_000_000), scale)
    if progress:
        progress(f"data: {len(sparse)} samples in {time.perf_counter() - start:.1f} s")
    rows = []
    for n, b, t, variant in itertools.product(workers, batch_per_worker, threads, laia):
        rows.append(run_case(sparse, cardinalities, workers=n, batch_per_worker=b, threads=t, laia=variant,
                             iterations=iterations, warmup=warmup, cache_ratio=cache_ratio))
        if progress:
            progress(format_row(rows[-1]))
    return rows


HEADER = f"{'workers':>8}{'batch/w':>8}{'threads':>8}{'laia':>9}{'scoring':>9}{'alloc':>9}{'update':>9}" \
         f"{'plan':>9}{'total ms':>10}"


def format_row(row: BenchRow) -> str:
    return (f"{row.workers:>8}{row.batch_per_worker:>8}{row.threads:>8}{row.laia:>9}"
            + "".join(f"{row.ms[s]:>9.3f}" for s in STAGES) + f"{row.total_ms:>10.3f}")
