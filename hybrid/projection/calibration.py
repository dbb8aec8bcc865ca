"""``hybrid project --calibrate CONFIG``: the time model's costs on this machine (a ``Profile``), as a file.

Measured from runs that no validation case predicts (docs/projection.md):

1. compute: the floor (the config's model in one process on one thread,
   ``hybrid bench plain``) at the config's batch per worker and half of it:
   a fixed cost per iteration and a cost per sample;
2. the loop's own costs: vanilla and herald with one worker and one PS
   rank at the same two batches, on this host (``hybrid bench train``) or,
   for a cluster whose store operations cross a network, across two
   emulated hosts (``link``, as ``hybrid bench e2e`` runs them). Their
   pull and push stages against the operations, rows and updated rows their
   loads count give the cost of an operation, of a row and of a row's update
   in the cache (least squares, none below zero); their data stage per
   sample; their allreduce stage (the calls, nothing to sum), barrier and
   ``other`` per iteration;
3. shared cores: the floor in 2 to ``2 x cores`` processes at once, side
   by side (started together, no barrier between iterations), each one's ms
   per iteration over one alone run right before (the median of ``repeats``
   such pairs: this machine's speed drifts within minutes). What BSP
   workers wait for each other is the patient collectives' (4): floors in
   step (a barrier after every iteration) counted it twice, 2.71x and 3.85x
   for 3 and 4 processes on 2 cores against 1.64x and 2.56x side by side,
   where the workers' own compute stage ran 1.47-1.61x with 3 workers
   (docs/projection.md);
4. patient collectives: the runtime's sum of the MLP's bytes and its
   barrier among 2 to ``2 x cores`` ranks waiting patiently, nothing else
   running (``collective_probe``): workers whose ranks share cores pay
   about one sleep per step of each; with ``link``, one rank per emulated
   host, where each step also crosses TCP.

The scheduler's time per global batch is measured with each case's loads
(``loads.loads``): it depends on the workers and the mode.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import platform
import queue
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from hybrid.bench import train_bench
from hybrid.bench.simulated import ensure_store
from hybrid.bench.emulated_hosts import LinkShape
from hybrid.config import Mode, load_config
from hybrid.data.store import BatchStore
from hybrid.projection.loads import loads
from hybrid.projection.prediction import mlp_bytes
from hybrid.projection.time_model import Profile

FLOOR = "plain+cluster.workers=1"
# one worker + one PS: vanilla pushes every row it trains, herald none (its updates stay in the cache), so the
# two separate a row's write from its update
LOOPS = {"vanilla+cluster.workers=1+cluster.ps=1": Mode.vanilla, "herald+cluster.workers=1+cluster.ps=1": Mode.herald}


def _batches(batch: int) -> tuple[int, int]:
    half = max(1, batch // 2)
    if half == batch:
        raise ValueError(f"train.batch_per_worker={batch}: calibration fits two batch sizes, the config's and half "
                         f"of it; use a batch of 2 or more")
    return half, batch


def _compute_of(fit: dict) -> tuple[float, float]:
    """(fixed ms per iteration, ms per sample) of the floor from ``hybrid bench train``'s fit of its compute
    stage over the batch sizes (``train_bench.fits``), neither below zero."""
    return max(0.0, fit["fixed_ms"]), max(0.0, fit["per_unit_us"] / 1000)


def _fit_operations(equations: list[tuple]) -> tuple:
    """The costs (ms) per unit from ``(units..., ms)`` stage measurements: non-negative least squares."""
    from scipy.optimize import nnls

    a = np.array([e[:-1] for e in equations], dtype=float)
    y = np.array([e[-1] for e in equations], dtype=float)
    return tuple(float(c) for c in nnls(a, y)[0])


FLOORS_TIMEOUT_S = 1800


def _floor_beside(config_path: str, overrides: list, iterations: int, barrier, results) -> None:
    """One of several floors side by side (a spawned process): ms per iteration after the warm-up, into
    ``results``; with ``barrier``, every floor waits for the others after its first step only, so that they
    start together (the warm-up steps are not timed)."""
    import torch

    from hybrid.bench.plain_torch import WARMUP, train_plain

    def start_together() -> None:
        nonlocal barrier
        if barrier is not None:
            barrier.wait()
            barrier = None

    torch.set_num_threads(1)
    config = load_config(config_path, [*overrides, "cluster.workers=1"])
    store = BatchStore.of(config.data, "train")
    *_, seconds = train_plain(config, store, iterations, after_step=start_together)
    results.put(1e3 * seconds / (iterations - WARMUP))


def shared_cores(config_path: str, overrides: list[str], *, processes: int, iterations: int, repeats: int,
                 say: Callable[[str], None]) -> tuple:
    """((busy processes, slowdown), ...): the floor in k processes side by side (started together, each at
    its own pace) against one alone, for k = 2 .. ``processes``; each the median over ``repeats`` of the
    ratio within a pair run back to back (this machine's speed drifts)."""
    context = multiprocessing.get_context("spawn")  # no MPI, torch or thread state inherited

    def together(k: int) -> float:
        barrier, results = (context.Barrier(k) if k > 1 else None), context.Queue()
        running = [context.Process(target=_floor_beside, args=(config_path, overrides, iterations, barrier, results))
                   for _ in range(k)]
        for process in running:
            process.start()
        ms, deadline = [], time.monotonic() + FLOORS_TIMEOUT_S
        while len(ms) < k:
            try:
                ms.append(results.get(timeout=1.0))
            except queue.Empty:
                failed = [p.exitcode for p in running if p.exitcode not in (None, 0)]
                if failed or time.monotonic() > deadline:  # the others would wait at the start for ever
                    for process in running:
                        process.terminate()
                    why = (f"exit {failed[0]}" + (" (killed: out of memory? each holds the whole table)"
                                                  if failed[0] == -9 else "")) if failed else "timed out"
                    raise RuntimeError(f"a floor of {k} side by side failed: {why}")
        for process in running:
            process.join()
        return statistics.median(ms)

    shares = []
    for k in range(2, processes + 1):
        ratios = [together(k) / together(1) for _ in range(repeats)]
        shares.append((k, round(statistics.median(ratios), 3)))
        say(f"shared cores: {k} processes side by side, each {shares[-1][1]:.2f}x the time of one alone "
            f"(pairs: {', '.join(f'{r:.2f}' for r in ratios)})")
    return tuple(shares)


def patient_collectives(n_bytes: int, *, processes: int, repeats: int, say: Callable[[str], None],
                        link: Optional[LinkShape] = None) -> tuple:
    """((workers, allreduce ms, barrier ms), ...) for 2 .. ``processes`` ranks waiting patiently in the runtime's
    collectives (``collective_probe``), each the median over ``repeats`` runs: on this host (``launch/mpirun.sh``),
    or with ``link`` one rank per emulated host joined by it (root), as the loops' calibration runs."""
    root = Path(__file__).resolve().parents[2]
    argv = [sys.executable, "-m", "hybrid.projection.collective_probe", "--bytes", str(n_bytes)]
    points = []
    for k in range(2, processes + 1):
        runs = []
        for _ in range(repeats):
            if link is None:
                done = subprocess.run(["bash", str(root / "launch" / "mpirun.sh"), "-n", str(k), *argv],
                                      capture_output=True, text=True, timeout=300, cwd=root)
            else:
                from hybrid.bench import e2e_bench
                from hybrid.bench.emulated_hosts import EmulatedHosts

                with EmulatedHosts(k, link) as hosts:
                    done = e2e_bench.run_across(hosts, k, argv, e2e_bench.one_machine_env(k), timeout=300)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode != 0 or not lines:
                raise RuntimeError(f"the collective probe on {k} ranks failed (exit {done.returncode}): "
                                   f"{(done.stdout + done.stderr).strip()[-400:]}")
            runs.append(json.loads(lines[-1]))
        points.append((k, round(statistics.median(r["allreduce_ms"] for r in runs), 4),
                       round(statistics.median(r["barrier_ms"] for r in runs), 4)))
        where = "this host" if link is None else f"emulated hosts, {link.label()}"
        say(f"patient collectives ({where}): {k} workers, {n_bytes} bytes summed in {points[-1][1]:.3f} ms, barrier "
            f"{points[-1][2]:.3f} ms (medians of {repeats})")
    return tuple(points)


def _loops_here(config_path: str, overrides: list, batches, iterations: int, repeats: int, say, *,
                loops: bool = True) -> tuple:
    """(the floor's rows, the loops' rows: none without ``loops``, the floor's compute fitted over the batches)
    of one ``hybrid bench train`` on this host."""
    modes = (FLOOR, *LOOPS) if loops else (FLOOR,)
    result = train_bench.run(config_path=config_path, sizes=("smoke",), modes=modes, iterations=iterations,
                             repeats=repeats, overrides=overrides, batches=batches, progress=say)
    if result["failed"]:
        raise RuntimeError(f"calibration runs failed: {result['failed']}")
    return ([r for r in result["cases"] if r["mode"] == FLOOR], [r for r in result["cases"] if r["mode"] in LOOPS],
            result["fits"][f"{FLOOR} smoke"]["compute"])


def _loops_across_hosts(config_path: str, overrides: list, batches, iterations: int, repeats: int,
                        link: LinkShape, say) -> list[dict]:
    """The loops' rows, each rank on an emulated host of its own joined by ``link`` (root), medians of repeats:
    the store's operations cost there what a message over TCP costs, not what shared memory does."""
    from hybrid.bench import e2e_bench
    from hybrid.bench.emulated_hosts import EmulatedHosts

    runs: dict = {}
    with EmulatedHosts(2, link) as hosts:
        for repeat in range(repeats):
            for batch in batches:
                for case in LOOPS:
                    mode = case.split("+")[0]
                    workload = e2e_bench.Workload("calibration", str(Path(config_path).resolve()),
                                                  (*overrides, "cluster.workers=1", "cluster.ps=1",
                                                   f"train.batch_per_worker={batch}"), iterations)
                    summary = e2e_bench.train_once(hosts, workload, mode, e2e_bench.one_machine_env(2), [])
                    summary["iteration_ms"].setdefault("other", train_bench.other_ms_of(summary))
                    runs.setdefault((case, batch), []).append(summary["iteration_ms"])
                    say(f"repeat {repeat + 1}/{repeats} b{batch} {case} across 2 emulated hosts ({link.label()}): "
                        f"{summary['throughput']:.0f} samples/s")
    return [{"mode": case, "batch_per_worker": batch,
             "iteration_ms": {k: statistics.median(ms[k] for ms in per_run) for k in per_run[0]}}
            for (case, batch), per_run in runs.items()]


def calibrate(config_path: str, overrides=(), *, iterations: int = 300, repeats: int = 3,
              link: Optional[LinkShape] = None, say: Callable[[str], None] = print) -> dict:
    """Measure the profile; returns ``{"profile": ..., "machine": ..., "measured": ...}`` (what is written).

    ``link``: the loops run across two emulated hosts joined by it (as root; for a cluster whose store
    operations cross a network), else on this host.
    """
    overrides = list(overrides)
    config = load_config(config_path, overrides)
    ensure_store(config, say)
    batches = _batches(config.train.batch_per_worker)
    floor, loop, floor_fit = _loops_here(config_path, overrides, batches, iterations, repeats, say,
                                         loops=link is None)
    if link is not None:
        loop = _loops_across_hosts(config_path, overrides, batches, iterations, repeats, link, say)
    compute_ms, sample_ms = _compute_of(floor_fit)
    store = BatchStore.of(config.data, "train")
    equations, per_sample, fixed = [], [], {"allreduce": [], "barrier": [], "other": []}
    for row in loop:
        mode = LOOPS[row["mode"]]
        run_config = load_config(config_path, [*overrides, "cluster.workers=1", "cluster.ps=1",
                                               f"scheduler.mode={mode.value}",
                                               f"train.batch_per_worker={row['batch_per_worker']}"])
        load = loads(run_config, store, mode, iterations=iterations).load
        ms = row["iteration_ms"]
        equations.append((load.pull_ops, load.pull_rows + load.writeback_rows + load.prefetch_rows, 0.0, ms["pull"]))
        equations.append((load.push_ops, load.push_rows, load.update_rows, ms["push"]))
        per_sample.append(ms["data"] / load.samples)
        for stage in fixed:
            fixed[stage].append(ms[stage])
    op_ms, row_ms, update_row_ms = _fit_operations(equations)
    cores = os.cpu_count() or 1
    shares = shared_cores(config_path, overrides, processes=2 * cores, iterations=iterations, repeats=repeats,
                           say=say)
    collectives = patient_collectives(mlp_bytes(config, store), processes=2 * cores, repeats=repeats, say=say,
                                      link=link)
    profile = Profile(op_ms=op_ms, row_ms=row_ms, update_row_ms=update_row_ms, sample_ms=sample_ms,
                      compute_ms=compute_ms,
                      data_sample_ms=statistics.mean(per_sample),
                      allreduce_ms=statistics.mean(fixed["allreduce"]), barrier_ms=statistics.mean(fixed["barrier"]),
                      other_ms=statistics.mean(fixed["other"]), shares=shares, collectives=collectives)
    return {"profile": asdict(profile), "config": config.name, "overrides": overrides,
            "loops_link": None if link is None else link.label(),
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": cores,
                        "python": platform.python_version()},
            "measured": {"iterations": iterations, "repeats": repeats, "batches": list(batches),
                         "floor_ms": {r["batch_per_worker"]: r["iteration_ms"]["compute"] for r in floor},
                         "loop_ms": {f"{r['mode']} b{r['batch_per_worker']}": r["iteration_ms"] for r in loop},
                         "stage_equations": [list(e) for e in equations]}}


def read_profile(path) -> Profile:
    """The profile a calibration wrote; a clear error for another file."""
    try:
        data = json.loads(Path(path).read_text())
        fields = data["profile"]
        fields["schedule_ms"] = tuple(map(tuple, fields.get("schedule_ms", ())))
        fields["shares"] = tuple(map(tuple, fields.get("shares", ())))
        fields["collectives"] = tuple(map(tuple, fields.get("collectives", ())))
        return Profile(**fields)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a profile written by hybrid project --calibrate ({err})") from err
