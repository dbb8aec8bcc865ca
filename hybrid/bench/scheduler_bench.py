"""``hybrid bench scheduler``: time per global batch of each scheduling stage (paper Fig. 12).

Herald mode (LAIA + on-demand plans) on Criteo-like synthetic data: scoring,
allocation, cluster-state update and plan, per global batch, as a worker's
scheduler thread runs them (with the prefetch marks, the event digest and
the worker's share of each plan), for several
worker counts, thread counts and LAIA variants, measured side by side in one
run. Every case runs ``repeats`` times, the cases alternating within a
repeat so a busy machine slows them alike; each stage is the median over
repeats. The paper reports 7.7 ms per batch with 16 threads (scoring 3.2 ms,
allocation 0.6 ms); the goal here is at most 1 ms for 8 workers on one thread.
"""
from __future__ import annotations

import itertools
import statistics
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hybrid import modes
from hybrid.bench.result_files import finish, markdown_table, pyplot
from hybrid.config import load_config
from hybrid.data.synthetic import CRITEO_KAGGLE, SyntheticGenerator
from hybrid.scheduling.amdahl import parallel_part

NAME = "scheduler"
TITLE = "Scheduling time per global batch by stage (paper Fig. 12)"
STAGES = ("scoring", "allocation", "state_update", "plan")
# the state update's and the plan's parts (BatchPlan.parts), so that the serial part inside a stage shows
PARTS = ("train", "update, the rest", "needs", "pushes", "plan, the rest")
WORKERS = (8, 16, 32, 64, 128)
PAPER = {"fig12_total_ms_16_threads": 7.7, "fig12_scoring_ms": 3.2, "fig12_allocation_ms": 0.6,
         "fig12_multithreaded_share": 0.92}


def repeats_note(kwargs: dict) -> str:
    """Timings vary run to run: each figure is a median."""
    return f"{kwargs.get('repeats', 3)} runs per case, alternating; each stage the median"


@dataclass
class BenchRow:
    workers: int
    batch_per_worker: int
    threads: int
    laia: str
    iterations: int
    ms: dict  # stage -> mean milliseconds per global batch (the median over repeats)
    total_runs_ms: list = field(default_factory=list)  # each repeat's total
    memory: dict = field(default_factory=dict)  # what the scheduler holds on a rank (measure_memory)
    speedup: float = 1.0  # over the same case on one thread: the median of per-repeat ratios
    parallel: dict = field(default_factory=dict)  # stage -> Amdahl's parallel share from its median here and on 1
    parts: dict = field(default_factory=dict)  # part (PARTS) -> mean ms per global batch (the median over repeats)
    parts_parallel: dict = field(default_factory=dict)  # part -> Amdahl's parallel share, as ``parallel``

    @property
    def total_ms(self) -> float:
        return sum(self.ms.values())

    def to_dict(self) -> dict:
        return {"workers": self.workers, "batch_per_worker": self.batch_per_worker, "threads": self.threads,
                "laia": self.laia, "iterations": self.iterations,
                **{f"{k}_ms": round(v, 4) for k, v in self.ms.items()}, "total_ms": round(self.total_ms, 4),
                "total_runs_ms": [round(t, 6) for t in self.total_runs_ms],  # ns: speed-ups are ratios of these
                "speedup_vs_1_thread": round(self.speedup, 3),
                **({"parallel_share": {k: round(v, 3) for k, v in self.parallel.items()}} if self.parallel else {}),
                "parts_ms": {k: round(v, 4) for k, v in self.parts.items()},
                **({"parts_parallel_share": {k: round(v, 3) for k, v in self.parts_parallel.items()}}
                   if self.parts_parallel else {}),
                **self.memory}


def synthetic_batches(n_samples: int, scale: float, seed: int = 0):
    """Criteo-like per-table ids for ``n_samples`` samples, and the table cardinalities."""
    generator = SyntheticGenerator(CRITEO_KAGGLE, rows=n_samples, scale=scale, seed=seed)
    sparse, _, _ = generator.chunk(0, n_samples)
    return sparse, np.asarray(generator.cardinalities)


# LAIA variants by name: the paper's exact and chunked Algorithm 1, the best new allocation, and the same placed
# in rounds of 16 concurrent blocks (laia.place_blocks: for hosts with threads to spare)
VARIANTS = {"exact": ["scheduler.laia=exact"], "chunked": ["scheduler.laia=chunked"],
            "cost": ["scheduler.laia=exact", "scheduler.scoring=cost", "scheduler.order=confident"],
            "blocks": ["scheduler.laia=exact", "scheduler.scoring=cost", "scheduler.order=confident",
                       "scheduler.blocks=16", "scheduler.block_size=32"]}


def _config(*, workers: int, batch_per_worker: int, threads: int, laia: str, cache_ratio: float):
    if laia not in VARIANTS:
        raise ValueError(f"LAIA variant {laia!r}: one of {', '.join(VARIANTS)}")
    return load_config(None, [f"cluster.workers={workers}", f"train.batch_per_worker={batch_per_worker}",
                              f"scheduler.threads={threads}", *VARIANTS[laia], "scheduler.mode=herald",
                              f"scheduler.chunks={max(8, threads * 4)}", f"cache.ratio={cache_ratio}"])


def _batches(sparse, batch: int, count: int):
    return (sparse[(i * batch) % (len(sparse) - batch + 1):][:batch] for i in range(count))


def measure_memory(sparse, cardinalities, *, workers: int, batch_per_worker: int, laia: str, warmup: int,
                   cache_ratio: float) -> dict:
    """What the scheduler holds on one rank after ``warmup`` batches, as Python's allocator traces it.

    NumPy reports its arrays to ``tracemalloc``, and the cluster state keeps
    all its memory in NumPy arrays, so this is the state (every worker's
    cache slots, the row holder sets, the need and event buffers) plus the
    policy's scratch. Untimed: tracing slows allocation.
    """
    config = _config(workers=workers, batch_per_worker=batch_per_worker, threads=1, laia=laia,
                     cache_ratio=cache_ratio)
    tracemalloc.start()
    try:
        scheduler = modes.scheduler_for(config, cardinalities=cardinalities, worker=0)
        for _ in scheduler.plans(_batches(sparse, config.global_batch, warmup)):
            pass
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    slots = workers * scheduler.state.capacity
    parts = scheduler.state.memory_parts()
    parts["policy and the rest"] = max(0, held - sum(parts.values()))
    return {"memory_mb": round(held / 2**20, 2), "peak_memory_mb": round(peak / 2**20, 2),
            "cache_slots": int(slots), "bytes_per_slot": round(held / slots, 1),
            "memory_parts_mb": {part: round(n / 2**20, 2) for part, n in parts.items()}}


def run_case(sparse, cardinalities, *, workers: int, batch_per_worker: int, threads: int, laia: str,
             iterations: int, warmup: int, cache_ratio: float) -> BenchRow:
    config = _config(workers=workers, batch_per_worker=batch_per_worker, threads=threads, laia=laia,
                     cache_ratio=cache_ratio)
    batch = config.global_batch
    scheduler = modes.scheduler_for(config, cardinalities=cardinalities, worker=0)  # as a worker runs it
    batches = _batches(sparse, batch, warmup + iterations)
    totals, parts = dict.fromkeys(STAGES, 0.0), dict.fromkeys(PARTS, 0.0)
    for plan in scheduler.plans(batches):
        if plan.step >= warmup:
            for stage in STAGES:
                totals[stage] += plan.timing[stage]
            for part in PARTS:
                parts[part] += plan.parts[part]
    return BenchRow(workers, batch_per_worker, threads, laia, iterations,
                    {k: 1000 * v / iterations for k, v in totals.items()},
                    parts={k: 1000 * v / iterations for k, v in parts.items()})


def median_row(runs: list[BenchRow]) -> BenchRow:
    """One case's runs as one row: each stage's median, and every run's total."""
    first = runs[0]
    return BenchRow(first.workers, first.batch_per_worker, first.threads, first.laia, first.iterations,
                    {k: statistics.median(r.ms[k] for r in runs) for k in STAGES}, [r.total_ms for r in runs],
                    parts={k: statistics.median(r.parts[k] for r in runs) for k in PARTS})


def run(*, workers=WORKERS, threads=(1, 2), batch_per_worker=(128,), laia=("exact", "chunked", "cost"),
        iterations: int = 30, warmup: int = 10, scale: float = 0.01, cache_ratio: float = 0.1, repeats: int = 3,
        say=lambda line: None) -> dict:
    """Every (workers, batch, threads, LAIA variant) case ``repeats`` times; the rows of medians."""
    largest = max(workers) * max(batch_per_worker) * (warmup + iterations)
    start = time.perf_counter()
    sparse, cardinalities = synthetic_batches(min(largest, 2_000_000), scale)
    say(f"data: {len(sparse)} samples in {time.perf_counter() - start:.1f} s")
    cases = list(itertools.product(workers, batch_per_worker, threads, laia))
    runs: dict = {case: [] for case in cases}
    for repeat in range(repeats):
        for n, b, t, variant in (cases if repeat % 2 == 0 else cases[::-1]):
            runs[(n, b, t, variant)].append(
                run_case(sparse, cardinalities, workers=n, batch_per_worker=b, threads=t, laia=variant,
                         iterations=iterations, warmup=warmup, cache_ratio=cache_ratio))
            say(f"repeat {repeat + 1}/{repeats}: {format_row(runs[(n, b, t, variant)][-1])}")
    rows = {case: median_row(runs[case]) for case in cases}
    memory = {}
    for n, b, t, variant in cases:
        if (n, b, variant) not in memory:  # the state does not depend on the thread count
            memory[(n, b, variant)] = measure_memory(sparse, cardinalities, workers=n, batch_per_worker=b,
                                                     laia=variant, warmup=warmup, cache_ratio=cache_ratio)
        row = rows[(n, b, t, variant)]
        row.memory = memory[(n, b, variant)]
        one = runs.get((n, b, 1, variant))
        if one:
            row.speedup = statistics.median(a.total_ms / r.total_ms for a, r in zip(one, runs[(n, b, t, variant)]))
        if one and t > 1:  # which stages the threads cut, and which hold the serial part
            single = rows[(n, b, 1, variant)]
            row.parallel = {s: parallel_part(single.ms[s], row.ms[s], t) for s in STAGES}
            row.parts_parallel = {p: parallel_part(single.parts[p], row.parts[p], t) for p in PARTS}
    return {"scale": scale, "cache_ratio": cache_ratio, "warmup": warmup, "repeats": repeats, "paper": PAPER,
            "rows": [rows[case].to_dict() for case in cases]}


HEADER = f"{'workers':>8}{'batch/w':>8}{'threads':>8}{'laia':>9}{'scoring':>9}{'alloc':>9}{'update':>9}" \
         f"{'plan':>9}{'total ms':>10}"


def format_row(row: BenchRow) -> str:
    return (f"{row.workers:>8}{row.batch_per_worker:>8}{row.threads:>8}{row.laia:>9}"
            + "".join(f"{row.ms[s]:>9.3f}" for s in STAGES) + f"{row.total_ms:>10.3f}")


def format_table(result: dict) -> str:
    """The rows of medians (a row dict holds ``STAGE_ms``), each thread count's speed-up and the memory per rank."""
    lines = [HEADER + f"{'speed-up':>9}{'MB/rank':>9}{'B/slot':>8}  parallel share (scoring/alloc/update/plan)"]
    for r in result["rows"]:
        lines.append(f"{r['workers']:>8}{r['batch_per_worker']:>8}{r['threads']:>8}{r['laia']:>9}"
                     + "".join(f"{r[f'{s}_ms']:>9.3f}" for s in STAGES) + f"{r['total_ms']:>10.3f}"
                     + f"{r.get('speedup_vs_1_thread', 1.0):>8.2f}x{r.get('memory_mb', 0.0):>9.1f}"
                     f"{r.get('bytes_per_slot', 0.0):>8.1f}"
                     + ("  " + "/".join(f"{r['parallel_share'][s]:.2f}" for s in STAGES) if "parallel_share" in r
                        else ""))
    largest = max(r["workers"] for r in result["rows"])
    fewest = min(r["threads"] for r in result["rows"])
    for r in result["rows"]:  # where the memory goes: the largest cluster, once per variant
        if r["workers"] == largest and r["threads"] == fewest and "memory_parts_mb" in r:
            lines.append(f"memory at {largest} workers, {r['laia']}: " + ", ".join(
                f"{part} {mb:.1f} MB" for part, mb in r["memory_parts_mb"].items()))
    for r in result["rows"]:  # inside the update and the plan: which part keeps the serial time
        if r["workers"] == largest and "parts_ms" in r:
            shares = r.get("parts_parallel_share")
            lines.append(f"parts at {largest} workers, {r['laia']}, {r['threads']} thread(s), ms"
                         + (" (parallel share)" if shares else "") + ": " + ", ".join(
                             f"{part} {ms:.3f}" + (f" ({shares[part]:.2f})" if shares else "")
                             for part, ms in r["parts_ms"].items()))
    return (f"ms per global batch, median of {result['repeats']} runs; speed-up over one thread (median of "
            f"per-repeat ratios); the scheduler's memory on one rank (all workers' cache slots); each stage's "
            f"parallel share, Amdahl's p from its medians on one thread and on this many "
            f"(hybrid/scheduling/amdahl.py)\n" + "\n".join(lines))


def markdown(document: dict) -> str:
    result = document["result"]
    rows = [[r["workers"], r["threads"], r["laia"], *(f"{r[f'{s}_ms']:.3f}" for s in STAGES), f"{r['total_ms']:.3f}",
             f"{r['speedup_vs_1_thread']:.2f}x" if "speedup_vs_1_thread" in r else "",
             f"{r['memory_mb']:.1f}" if "memory_mb" in r else ""]
            for r in result["rows"]]
    rows.append(["paper (testbed)", 16, "static", PAPER["fig12_scoring_ms"], PAPER["fig12_allocation_ms"],
                 "figure only", "figure only", PAPER["fig12_total_ms_16_threads"], "", ""])
    table = markdown_table(["workers", "threads", "LAIA", "scoring", "allocation", "state update", "plan",
                            "total ms", "speed-up over 1 thread", "MB per rank"], rows)
    row = result["rows"][0]
    return (f"Milliseconds per global batch of {row['batch_per_worker']} samples per worker, herald mode, 26 "
            f"Criteo-like tables at scale {result['scale']}, {int(100 * result['cache_ratio'])}% caches, "
            f"{row['iterations']} timed batches after {result['warmup']} warm-up; medians of {result['repeats']} "
            f"runs. The paper's text gives its per-batch total, scoring and allocation (the worker count of that "
            f"figure is not stated in the text; per count: figure only).\n\n" + table)


def plot(document: dict, path: Path) -> None:
    """Stacked bars: each stage's median per case (as Fig. 12)."""
    plt = pyplot()
    rows = document["result"]["rows"]
    labels = [f"{r['workers']}w {r['threads']}t\n{r['laia']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(7, 0.6 * len(rows)), 5))
    bottom = [0.0] * len(rows)
    for stage in STAGES:
        values = [r[f"{stage}_ms"] for r in rows]
        ax.bar(range(len(rows)), values, bottom=bottom, label=stage)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("ms per global batch")
    ax.legend(fontsize=7)
    finish(fig, path, "hybrid bench scheduler: stages per global batch")
