"""``hybrid project --calibrate CONFIG``: the time model's costs on this machine (a ``Profile``), as a file.

Measured from runs that no validation case predicts (docs/projection.md):

1. compute: the floor (the config's model in one process on one thread,
   ``hybrid bench plain``) at the config's batch per worker and half of it:
   a fixed cost per iteration and a cost per sample;
2. the loop's own costs: vanilla with one worker and one PS rank on this
   host (``hybrid bench train``) at the same two batches. Its pull and push
   stages against the operations and rows its loads count give the cost of
   an operation and of a row (least squares, neither below zero); its data
   stage per sample; its allreduce stage (the calls, nothing to sum), its
   barrier and ``other`` per iteration;
3. shared cores: the floor in 1 to ``2 x cores`` processes at once, each
   one's ms per iteration over one alone.

The scheduler's time per global batch is measured with each case's loads
(``loads.loads``): it depends on the workers and the mode.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np

from hybrid.bench import train_bench
from hybrid.config import Mode, load_config
from hybrid.data.store import BatchStore
from hybrid.projection.loads import loads
from hybrid.projection.time_model import Profile

FLOOR = "plain+cluster.workers=1"
LOOP = "vanilla+cluster.workers=1+cluster.ps=1"


def _batches(batch: int) -> tuple[int, int]:
    half = max(1, batch // 2)
    if half == batch:
        raise ValueError(f"train.batch_per_worker={batch}: calibration fits two batch sizes, the config's and half "
                         f"of it; use a batch of 2 or more")
    return half, batch


def _fit_compute(floor_rows: list[dict]) -> tuple[float, float]:
    """(fixed ms per iteration, ms per sample) through the floor's two batch sizes."""
    x = np.array([r["batch_per_worker"] for r in floor_rows], dtype=float)
    y = np.array([r["iteration_ms"]["compute"] for r in floor_rows])
    slope, fixed = np.polyfit(x, y, 1)
    return max(0.0, float(fixed)), max(0.0, float(slope))


def _fit_operations(equations: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(ms per operation, ms per row) from ``(operations, rows, ms)`` stage measurements, neither below 0."""
    a = np.array([[ops, rows] for ops, rows, _ in equations], dtype=float)
    y = np.array([ms for _, _, ms in equations])
    (op, row), *_ = np.linalg.lstsq(a, y, rcond=None)
    if op < 0:  # the rows explain it all
        return 0.0, max(0.0, float(np.dot(a[:, 1], y) / np.dot(a[:, 1], a[:, 1])))
    if row < 0:
        return max(0.0, float(np.dot(a[:, 0], y) / np.dot(a[:, 0], a[:, 0]))), 0.0
    return float(op), float(row)


def shared_cores(config_path: str, overrides: list[str], *, processes: int, iterations: int,
                 say: Callable[[str], None]) -> tuple:
    """((busy processes, slowdown), ...): the floor in k processes at once, for k = 2 .. ``processes``."""
    command = [sys.executable, "-m", "hybrid", "bench", "plain", str(Path(config_path).resolve()), *overrides,
               "cluster.workers=1", "--threads", "1", "--iterations", str(iterations), "--json"]

    def together(k: int) -> float:
        running = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    cwd=train_bench.ROOT) for _ in range(k)]
        ms = []
        for process in running:
            out, err = process.communicate()
            if process.returncode != 0:
                raise RuntimeError(f"bench plain failed ({' '.join(command)}):\n{err[-2000:]}")
            ms.append(json.loads(out.strip().splitlines()[-1])[0]["ms_per_iteration"])
        return statistics.median(ms)

    alone = together(1)
    shares = []
    for k in range(2, processes + 1):
        shares.append((k, round(together(k) / alone, 3)))
        say(f"shared cores: {k} processes at once run {shares[-1][1]:.2f}x slower than one alone")
    return tuple(shares)


def calibrate(config_path: str, overrides=(), *, iterations: int = 300, repeats: int = 3,
              say: Callable[[str], None] = print) -> dict:
    """Measure the profile; returns ``{"profile": ..., "machine": ..., "measured": ...}`` (what is written)."""
    overrides = list(overrides)
    config = load_config(config_path, overrides)
    batches = _batches(config.train.batch_per_worker)
    result = train_bench.run(config_path=config_path, sizes=("smoke",), modes=(FLOOR, LOOP), iterations=iterations,
                             repeats=repeats, overrides=overrides, batches=batches, progress=say)
    if result["failed"]:
        raise RuntimeError(f"calibration runs failed: {result['failed']}")
    floor = [r for r in result["cases"] if r["mode"] == FLOOR]
    loop = [r for r in result["cases"] if r["mode"] == LOOP]
    compute_ms, sample_ms = _fit_compute(floor)
    store = BatchStore.of(config.data, "train")
    equations, per_sample, fixed = [], [], {"allreduce": [], "barrier": [], "other": []}
    for row in loop:
        run_config = load_config(config_path, [*overrides, "cluster.workers=1", "cluster.ps=1",
                                               "scheduler.mode=vanilla", f"train.batch_per_worker={row['batch_per_worker']}"])
        load = loads(run_config, store, Mode.vanilla, iterations=iterations).load
        ms = row["iteration_ms"]
        equations.append((load.pull_ops, load.pull_rows + load.writeback_rows + load.prefetch_rows, ms["pull"]))
        equations.append((load.push_ops, load.push_rows, ms["push"]))
        per_sample.append(ms["data"] / load.samples)
        for stage in fixed:
            fixed[stage].append(ms[stage])
    op_ms, row_ms = _fit_operations(equations)
    cores = os.cpu_count() or 1
    shares = shared_cores(config_path, overrides, processes=2 * cores, iterations=iterations, say=say)
    profile = Profile(op_ms=op_ms, row_ms=row_ms, sample_ms=sample_ms, compute_ms=compute_ms,
                      data_sample_ms=statistics.mean(per_sample),
                      allreduce_ms=statistics.mean(fixed["allreduce"]), barrier_ms=statistics.mean(fixed["barrier"]),
                      other_ms=statistics.mean(fixed["other"]), shares=shares)
    return {"profile": asdict(profile), "config": config.name, "overrides": overrides,
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": cores,
                        "python": platform.python_version()},
            "measured": {"iterations": iterations, "repeats": repeats, "batches": list(batches),
                         "floor_ms": {r["batch_per_worker"]: r["iteration_ms"]["compute"] for r in floor},
                         "loop_ms": {r["batch_per_worker"]: r["iteration_ms"] for r in loop},
                         "stage_equations": [list(e) for e in equations]}}


def read_profile(path) -> Profile:
    """The profile a calibration wrote; a clear error for another file."""
    try:
        data = json.loads(Path(path).read_text())
        fields = data["profile"]
        fields["schedule_ms"] = tuple(map(tuple, fields.get("schedule_ms", ())))
        fields["shares"] = tuple(map(tuple, fields.get("shares", ())))
        return Profile(**fields)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a profile written by hybrid project --calibrate ({err})") from err
