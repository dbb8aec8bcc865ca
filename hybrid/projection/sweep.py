"""``hybrid project CONFIG --sweep``: each mode's iteration on GPU clusters of many sizes, links and PS hosts.

For each PS count and worker count the simulator counts each mode's load
(``loads``; the scheduler timed here on one thread and on two), and for
each link the time model gives the iteration of GPU workers (``gpu``: the
compute stated, not measured) with the worker's host costs calibrated on
this machine. Reported per case: ms per iteration and global samples/s,
the stage that bounds it, the speed-up over the first mode, the bytes each
PS host's NIC moves per second at that pace (its busier direction), each PS
host's memory (this data's tables and, for synthetic data, the real
dataset's), and the scheduler threads per rank that keep the plans ahead of
the iteration: the scheduler's time on ``n`` threads is taken as Amdahl's
``t1 ((1 - p) + p / n)`` with the parallel part ``p`` from the two timings
here (docs/projection.md says how far that holds).
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

from hybrid import modes
from hybrid.bench.result_files import finish, pyplot
from hybrid.bench.simulated import ensure_store
from hybrid.config import load_config
from hybrid.data.store import BatchStore
from hybrid.projection.gpu import Device, flops_per_sample, gpu_profile
from hybrid.projection.loads import loads
from hybrid.projection.prediction import mlp_bytes
from hybrid.projection.time_model import CHECK_BYTES, Cluster, Profile, Load, bounding_stage, stage_ms
from hybrid.runtime.shard_plan import ShardPlan
from hybrid.scheduling.amdahl import parallel_part, time_on

MAX_THREADS = 1024


@dataclass(frozen=True)
class Grid:
    """The clusters a sweep projects to: every combination of workers, NIC rates and PS hosts."""

    modes: tuple
    workers: tuple
    gbps: tuple
    ps: tuple
    workers_per_host: int = 8
    latency_ms: float = 0.01
    scheduler_threads: int = 16

    def __post_init__(self):
        if not (self.modes and self.workers and self.gbps and self.ps):
            raise ValueError("a sweep needs at least one mode, worker count, NIC rate and PS count")


def threads_needed(budget_ms: float, one_thread_ms: float, part: float) -> Optional[int]:
    """The fewest threads whose schedule takes at most ``budget_ms`` (None: no count reaches it)."""
    if one_thread_ms <= budget_ms:
        return 1
    serial = one_thread_ms * (1.0 - part)
    if serial >= budget_ms or part <= 0:
        return None
    threads = math.ceil(one_thread_ms * part / (budget_ms - serial))
    return threads if threads <= MAX_THREADS else None


def nic_gbps(load: Load, cluster: Cluster, iteration_ms: float) -> float:
    """Gbit/s through the busiest PS host's NIC at the iteration's pace, its busier direction."""
    row = load.row_bytes
    out = (load.ps_pull_rows + load.ps_prefetch_rows) * row + load.ps_check_rows * CHECK_BYTES
    into = (load.ps_push_rows + load.ps_writeback_rows) * row
    return max(out, into) * 8 / (iteration_ms * 1e-3) / 1e9


def ps_memory_gb(n_rows: int, ps: int, row_bytes: int) -> float:
    """GB of rows (optimizer state included) on the busiest PS host, the rows split in contiguous ranges."""
    return int(ShardPlan.contiguous(n_rows, ps).sizes.max()) * row_bytes / 1e9


def timed_plans(config, store: BatchStore, mode, iterations: int) -> float:
    """ms per global batch of the scheduler alone (no events read), after the warm-up."""
    scheduler, batches = modes.get(mode).simulation(config, store, iterations, worker=0)
    total, counted = 0.0, 0
    plans = scheduler.plans(itertools.islice(batches, iterations))
    while True:
        start = time.perf_counter()
        plan = next(plans, None)
        if plan is None:
            break
        if plan.step >= config.scheduler.warmup_iterations:
            total, counted = total + time.perf_counter() - start, counted + 1
    return 1e3 * total / max(1, counted)


@dataclass(frozen=True)
class Counted:
    """One mode's run at one worker and PS count: its load, the scheduler's times here, and what pricing
    it on a cluster needs of the config."""

    mode: str
    workers: int
    ps: int
    load: Load
    schedule_ms_1thread: float
    schedule_ms_2threads: float
    flops_per_sample: float
    global_batch: int
    ps_gb: float
    ps_gb_full_scale: Optional[float]


def count(config_path: str, grid: Grid, *, overrides=(), iterations: int = 0,
          say: Callable[[str], None] = lambda line: None) -> list[Counted]:
    """Every mode's load at every worker and PS count of ``grid`` (the simulator; the scheduler timed here)."""
    counted = []
    for ps, workers, mode in itertools.product(grid.ps, grid.workers, grid.modes):
        case = [*overrides, f"cluster.workers={workers}", f"cluster.ps={ps}", f"scheduler.mode={mode}"]
        config = load_config(config_path, [*case, "scheduler.threads=1"])
        ensure_store(config, say)
        store = BatchStore.of(config.data, "train")
        length = iterations and iterations + config.scheduler.warmup_iterations
        say(f"counting {mode} with {workers} workers and {ps} PS ({length or 'all'} global batches)")
        run = loads(config, store, config.scheduler.mode, iterations=length, mlp_bytes=mlp_bytes(config, store))
        two = timed_plans(load_config(config_path, [*case, "scheduler.threads=2"]), store, config.scheduler.mode,
                          length or modes.run_length(config, store))
        counted.append(Counted(mode, workers, ps, run.load, run.schedule_ms, two, flops_per_sample(config, store),
                               config.global_batch, ps_memory_gb(int(store.cardinalities.sum()), ps, config.row_bytes),
                               _full_scale_gb(config, store, ps)))
    return counted


def price(counted: list[Counted], profile: Profile, grid: Grid, gpu: Device,
          host_ms: Optional[float] = None) -> list[dict]:
    """Each counted run on each NIC rate of ``grid``, a row each; speed-ups over the first mode of its cluster."""
    rows, base = [], {}
    for run in counted:
        part = parallel_part(run.schedule_ms_1thread, run.schedule_ms_2threads)
        host = gpu_profile(profile, gpu, run.flops_per_sample, host_ms)
        host = replace(host, schedule_ms=((run.workers, time_on(grid.scheduler_threads, run.schedule_ms_1thread,
                                                                    part)),))
        for gbps in grid.gbps:
            cluster = Cluster(workers=run.workers, ps=run.ps, workers_per_host=grid.workers_per_host, gbps=gbps,
                              latency_ms=grid.latency_ms)
            stages = stage_ms(run.load, cluster, host)
            total = sum(stages.values())
            first = base.setdefault((run.workers, run.ps, gbps), total)
            rows.append({"mode": run.mode, "workers": run.workers, "ps": run.ps, "gbps": gbps,
                         "iteration_ms": round(total, 3), "samples_per_s": round(run.global_batch / total * 1e3),
                         "speedup": round(first / total, 3), "bound": bounding_stage(stages),
                         "stages": {k: round(v, 3) for k, v in stages.items()},
                         "schedule_ms_1thread": round(run.schedule_ms_1thread, 3),
                         "schedule_ms_2threads": round(run.schedule_ms_2threads, 3),
                         "threads_needed": threads_needed(total - stages["schedule_wait"], run.schedule_ms_1thread,
                                                          part),
                         "ps_nic_gbps": round(nic_gbps(run.load, cluster, total), 2), "ps_gb": run.ps_gb,
                         "ps_gb_full_scale": run.ps_gb_full_scale})
    return sorted(rows, key=lambda r: (r["ps"], r["workers"], grid.modes.index(r["mode"]), r["gbps"]))


def sweep(config_path: str, profile: Profile, grid: Grid, gpu: Device, *, overrides=(), iterations: int = 0,
          host_ms: Optional[float] = None, say: Callable[[str], None] = lambda line: None) -> dict:
    """Every mode on every cluster of ``grid``; the first mode is the speed-ups' denominator. ``host_ms``: a
    GPU worker's host cost per iteration (default: the profile's fixed compute, ``gpu.gpu_profile``)."""
    rows = price(count(config_path, grid, overrides=overrides, iterations=iterations, say=say), profile, grid, gpu,
                 host_ms)
    return {"config": str(config_path), "overrides": list(overrides), "gpu": gpu.__dict__, "host_ms": host_ms,
            "grid": {k: list(v) if isinstance(v, tuple) else v for k, v in grid.__dict__.items()},
            "profile": profile.__dict__, "rows": rows}


def _full_scale_gb(config, store: BatchStore, ps: int) -> Optional[float]:
    """The busiest PS host's GB at the real dataset's cardinalities, for synthetic data shaped like one."""
    source = store.meta.get("source", {})
    if source.get("kind") != "synthetic":
        return None
    from hybrid.data.synthetic import PROFILES

    rows = sum(t.cardinality for t in PROFILES[source["like"]].tables)
    return ps_memory_gb(rows, ps, config.row_bytes)


def format_table(result: dict) -> str:
    """One line per case."""
    lines = [f"{'mode':<10}{'workers':>8}{'PS':>4}{'Gbit/s':>8}{'ms/it':>9}{'samples/s':>12}{'speed-up':>9}"
             f"  {'bound':<10}{'sched 1t':>9}{'threads':>8}{'PS NIC':>8}{'PS GB':>8}"]
    for r in result["rows"]:
        threads = "-" if r["threads_needed"] is None else str(r["threads_needed"])
        full = r["ps_gb_full_scale"] if r["ps_gb_full_scale"] is not None else r["ps_gb"]
        lines.append(f"{r['mode']:<10}{r['workers']:>8}{r['ps']:>4}{r['gbps']:>8g}{r['iteration_ms']:>9.2f}"
                     f"{r['samples_per_s']:>12,}{r['speedup']:>9.2f}  {r['bound']:<10}"
                     f"{r['schedule_ms_1thread']:>9.1f}{threads:>8}{r['ps_nic_gbps']:>8.1f}{full:>8.3g}")
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    """Global samples/s against workers, a panel per (PS hosts, NIC rate), a line per mode."""
    rows = result["rows"]
    panels = sorted({(r["ps"], r["gbps"]) for r in rows})
    figure, axes = pyplot().subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), squeeze=False, sharey=True)
    for axis, (ps, gbps) in zip(axes[0], panels):
        for mode in dict.fromkeys(r["mode"] for r in rows):
            points = sorted((r["workers"], r["samples_per_s"]) for r in rows
                            if r["mode"] == mode and r["ps"] == ps and r["gbps"] == gbps)
            axis.plot(*zip(*points), marker="o", label=mode)
        axis.set(xscale="log", yscale="log", xlabel="GPU workers", title=f"{ps} PS host(s), {gbps:g} Gbit/s")
        axis.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("samples/s (projected)")
    axes[0][0].legend()
    finish(figure, path, f"{result['config']}: projected on {result['gpu']['name']} workers (compute stated, not measured)")
