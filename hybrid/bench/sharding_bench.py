"""``hybrid bench sharding``: each shard planner's plan, timed through the real store (docs/design.md section 8).

Run under MPI with one worker and as many PS ranks as the largest count
asked for (``launch/mpirun.sh -n 5 python -m hybrid bench sharding`` for 2
and 4 PS ranks): rank 0 is the worker, the last ranks the PS ranks (a plan
for fewer ranks uses the last of them; the others only join collectives).

Task sets as NeuroShard's: ``n`` tables drawn from the Criteo-like profile
(cardinalities at ``scale``, each with its own popularity skew, sessions
and coupling), one embedding width per task (this store has one width for
all tables). Each iteration is one global batch of ``batch`` samples of the
synthetic generator, one id per table per sample. For every plan the worker times, per
PS rank, reading that rank's distinct rows of the batch and adding their
gradients back (``pull`` then ``accumulate``, each completed): the rank's
cost per iteration, the median over iterations, the planners alternating
within each iteration. A plan's cost is its slowest rank's: an iteration
waits for it. Timings on one host are memory-bound and noisy; the ratios
between planners in one run are what to read.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from hybrid.counter_hash import stream_id, uniform3
from hybrid.data.synthetic import CRITEO_KAGGLE, Profile, SyntheticGenerator
from hybrid.shard_planners import PLANNERS, make_plan

NAME = "sharding"
TITLE = "Shard planners timed through the store (NeuroShard's baselines)"
TASKS = ((10, 16), (30, 64), (60, 128), (20, 4))  # (tables, dim)


def repeats_note(kwargs: dict) -> str:
    """Timings vary run to run: each figure is a median over iterations, the first left out."""
    return f"median of {kwargs.get('iterations', 30) - 1} iterations per rank, the planners alternating"


def task_profile(n_tables: int) -> Profile:
    """A task of ``n_tables`` tables drawn (with repeats) from the Criteo-like profile's, with their skews."""
    specs = CRITEO_KAGGLE.tables
    picks = (uniform3(0, stream_id("sharding-task", n_tables), np.arange(n_tables, dtype=np.uint64))
             * len(specs)).astype(np.int64)
    tables = tuple(replace(specs[p], name=f"{specs[p].name}-{k}") for k, p in enumerate(picks))
    return replace(CRITEO_KAGGLE, name=f"sharding-{n_tables}", tables=tables, n_dense=0)


def task_batches(n_tables: int, *, scale: float, batch: int, iterations: int, seed: int):
    """The task's table cardinalities and ``iterations`` batches of its distinct global rows (the generator's)."""
    generator = SyntheticGenerator(task_profile(n_tables), rows=batch * iterations, scale=scale, seed=seed)
    sparse, _, _ = generator.chunk(0, batch * iterations)
    offsets = np.concatenate([[0], np.cumsum(generator.cardinalities)[:-1]])
    rows = sparse.astype(np.int64) + offsets
    return generator.cardinalities, [np.unique(rows[it * batch:(it + 1) * batch]) for it in range(iterations)]


def _time_ranks(stores: dict, batches, dim: int) -> dict:
    """Per planner, the median milliseconds per iteration each PS rank's rows take to read and add back.

    The planners alternate within every iteration, so the machine's noise
    falls on all of them alike; the first iteration is a warm-up.
    """
    times = {name: [[] for _ in range(plan.n_shards)] for name, (plan, _) in stores.items()}
    for rows in batches:
        for name, (plan, store) in stores.items():
            shard = plan.shard_of(rows)
            for s in range(plan.n_shards):
                mine = rows[shard == s]
                out = np.empty((len(mine), dim), dtype=np.float32)
                start = time.perf_counter()
                store.pull(mine, out).wait()
                store.accumulate(mine, out).wait()
                times[name][s].append(time.perf_counter() - start)
    return {name: [round(1e3 * float(np.median(t[1:] if len(t) > 1 else t)), 4) for t in per_rank]
            for name, per_rank in times.items()}


def run(*, tasks=TASKS, ps_counts=(2, 4), planners=PLANNERS, batch: int = 4096, iterations: int = 30,
        scale: float = 0.001, transport: str = "rma", seed: int = 0, say=lambda line: None) -> dict | None:
    """Every planner's per-rank cost on every task and PS count; the result on rank 0 (collective)."""
    from mpi4py import MPI

    from hybrid.rma_store import EmbeddingStore

    world = MPI.COMM_WORLD
    if world.size < 1 + max(ps_counts):
        raise ValueError(f"hybrid bench sharding needs 1 worker + {max(ps_counts)} PS ranks: "
                         f"launch/mpirun.sh -n {1 + max(ps_counts)} python -m hybrid bench sharding")
    cases = []
    for n_tables, dim in tasks:
        cardinalities, batches = task_batches(n_tables, scale=scale, batch=batch, iterations=iterations, seed=seed)
        for n_ps in ps_counts:
            ps_ranks = list(range(world.size - n_ps, world.size))
            stores = {}
            for planner in planners:  # every plan's store at once (collective, in the same order everywhere)
                plan = make_plan(planner, cardinalities, n_ps, dim=dim, seed=seed)
                stores[planner] = (plan, EmbeddingStore(world, ps_ranks, plan.n_rows, dim, transport=transport,
                                                        plan=plan))
            if world.rank == 0:
                timed = _time_ranks(stores, batches, dim)
                for planner, (plan, _) in stores.items():
                    served = [float(np.mean([np.count_nonzero(plan.shard_of(b) == s) for b in batches]))
                              for s in range(n_ps)]
                    cases.append({"tables": n_tables, "dim": dim, "ps": n_ps, "planner": planner,
                                  "max_ms": max(timed[planner]), "ranks_ms": timed[planner],
                                  "rows_served": [round(x, 1) for x in served], "rows_per_rank": plan.sizes.tolist()})
                    say(format_case(cases[-1]))
            for _, store in stores.values():
                store.barrier()
                store.close()
    if world.rank != 0:
        return None
    return {"batch": batch, "iterations": iterations, "scale": scale, "transport": transport, "cases": cases,
            "best": best_per_task(cases)}


def best_per_task(cases: list[dict]) -> list[dict]:
    """Per (tables, dim, PS count): each planner's max per-rank cost over the default plan's."""
    out = []
    for key in sorted({(c["tables"], c["dim"], c["ps"]) for c in cases}):
        mine = [c for c in cases if (c["tables"], c["dim"], c["ps"]) == key]
        default = next(c["max_ms"] for c in mine if c["planner"] == "row-ranges")
        out.append({"tables": key[0], "dim": key[1], "ps": key[2],
                    "vs_row_ranges": {c["planner"]: round(c["max_ms"] / default, 3) if default else None
                                      for c in mine}})
    return out


def format_case(case: dict) -> str:
    return (f"{case['tables']:>4} tables dim {case['dim']:>3} on {case['ps']} PS  {case['planner']:<12} "
            f"slowest rank {case['max_ms']:7.3f} ms  (ranks {case['ranks_ms']}, distinct rows {case['rows_served']})")


def format_table(result: dict) -> str:
    planners = list(next(iter(result["best"]))["vs_row_ranges"]) if result["best"] else []
    lines = [f"{'tables':>6}{'dim':>5}{'ps':>4}" + "".join(f"{p:>13}" for p in planners)]
    for row in result["best"]:
        lines.append(f"{row['tables']:>6}{row['dim']:>5}{row['ps']:>4}"
                     + "".join(f"{row['vs_row_ranges'][p]:>13.3f}" for p in planners))
    return ("slowest PS rank's time per iteration over the default row ranges' (lower is better)\n"
            + "\n".join(lines))


def plot(document: dict, path) -> None:
    """Each planner's slowest-rank time over the default plan's, grouped by task."""
    from hybrid.bench.result_files import finish, grouped_bars, pyplot

    plt = pyplot()
    rows = document["result"]["best"]
    groups = [f"{r['tables']}t d{r['dim']} {r['ps']}ps" for r in rows]
    planners = list(rows[0]["vs_row_ranges"]) if rows else []
    fig, ax = plt.subplots(figsize=(12, 4.5))
    grouped_bars(ax, groups, {p: [r["vs_row_ranges"][p] or 0.0 for r in rows] for p in planners},
                 "slowest PS rank / row-ranges'")
    ax.legend(fontsize=7, ncol=4)
    finish(fig, path, "hybrid bench sharding")
