"""``hybrid bench sharding``: each shard planner's plan, timed through the real store (docs/design.md section 8).

Run under MPI with one worker and as many PS ranks as the largest count
asked for (``launch/mpirun.sh -n 5 python -m hybrid bench sharding`` for 2
and 4 PS ranks): rank 0 is the worker, the last ranks the PS ranks (a plan
for fewer ranks uses the last of them; the others only join collectives).

Task sets as NeuroShard's (:mod:`hybrid.sharding.tasks`): ``n`` tables
drawn from the Criteo-like pool, one embedding width per task (this store
has one width for all tables). Each iteration is one global batch of
``batch`` samples of the synthetic generator, one id per table per sample.
For every plan the worker times, per PS rank, reading what that rank holds
of the batch's distinct rows (whole rows, or its column slices of them) and
adding their gradients back (``pull`` then ``accumulate``, each completed):
the rank's cost per iteration, the median over iterations, the planners
alternating within each iteration. A plan's cost is its slowest rank's.
It also times the same reads and additions issued to every rank at once
(``all_ms``), what a worker waits for in training.

The cost-model planner (``neuroshard``) needs cost models: ``cost_model``
names a file written by ``hybrid shard-costs train``; without one, the run
first collects cost data through the store and trains them (the time and
the held-out errors are reported). Its plan is searched on the worker from
the first iterations' ids and sent to the PS ranks; the search time is
reported. Timings on one host are memory-bound and noisy; the ratios
between planners in one run are what to read.
"""
from __future__ import annotations

import time

import numpy as np

from hybrid.sharding.planners import PLANNERS, make_plan, shard_load
from hybrid.sharding.tasks import global_batches, table_ids, task_profile

NAME = "sharding"
TITLE = "Shard planners timed through the store (NeuroShard and its baselines)"
TASKS = ((10, 16), (30, 64), (60, 128), (20, 4))  # (tables, dim)
ALL_PLANNERS = (*PLANNERS, "neuroshard")


def repeats_note(kwargs: dict) -> str:
    """Timings vary run to run: each figure is a median over iterations, the first left out."""
    return f"median of {kwargs.get('iterations', 30) - 1} iterations per rank, the planners alternating"


def rows_on(plan, rows: np.ndarray, shard: int, dim: int) -> np.ndarray:
    """The rows of which ``shard`` holds anything (whole rows or a column slice)."""
    if not plan.columns:
        return rows[plan.shard_of(rows) == shard]
    position, where, *_ = plan.pieces(rows, dim)
    return rows[np.unique(position[where == shard])]


def _time_ranks(stores: dict, batches, dim: int) -> tuple[dict, dict]:
    """Per planner, the median milliseconds per iteration of each PS rank's share, and of all ranks at once.

    The planners alternate within every iteration, so the machine's noise
    falls on all of them alike; the first iteration is a warm-up.
    """
    times = {name: [[] for _ in range(plan.n_shards)] for name, (plan, _) in stores.items()}
    together = {name: [] for name in stores}
    for rows in batches:
        for name, (plan, store) in stores.items():
            for s in range(plan.n_shards):
                mine = rows_on(plan, rows, s, dim)
                out = np.empty((len(mine), dim), dtype=np.float32)
                start = time.perf_counter()
                store.pull(mine, out, only=s).wait()
                store.accumulate(mine, out, only=s).wait()
                times[name][s].append(time.perf_counter() - start)
            out = np.empty((len(rows), dim), dtype=np.float32)
            start = time.perf_counter()
            store.pull(rows, out).wait()
            store.accumulate(rows, out).wait()
            together[name].append(time.perf_counter() - start)

    def median_ms(values):
        return round(1e3 * float(np.median(values[1:] if len(values) > 1 else values)), 4)
    return ({name: [median_ms(t) for t in per_rank] for name, per_rank in times.items()},
            {name: median_ms(t) for name, t in together.items()})


def _cost_models(world, cost_model, collect_kwargs: dict, say):
    """The cost models (rank 0; None elsewhere) and how they were made: loaded, or collected and trained here."""
    from hybrid.sharding import cost_data
    from hybrid.sharding.cost_models import CostModels, fit_comm, fit_serving

    if cost_model:
        models = CostModels.load(cost_model) if world.rank == 0 else None
        return models, {"cost_model": str(cost_model)}
    data = cost_data.collect(say=say, **collect_kwargs)  # collective
    if world.rank != 0:
        return None, {}
    started = time.perf_counter()
    serving = fit_serving(data["serving_sets"], data["serving_ms"])
    comm = fit_comm(data["comm_bytes"], data["comm_ms"])
    models = CostModels.from_fits(serving, comm, collected_seconds=round(data["seconds"], 1))
    info = {"collect_seconds": round(data["seconds"], 1), "train_seconds": round(time.perf_counter() - started, 1),
            "serving_samples": len(data["serving_ms"]), "comm_samples": len(data["comm_ms"]),
            "serving_fit": serving.errors(), "comm_fit": comm.errors()}
    say(f"cost models: {info}")
    return models, info


def _neuroshard_plan(world, models, cardinalities, ids, n_ps: int, dim: int, search_iterations: int):
    """The cost-model planner's plan, searched on rank 0 from the first iterations' ids, sent to every rank."""
    from hybrid.sharding import neuroshard
    from hybrid.runtime.shard_plan import ShardPlan

    account = None
    if world.rank == 0:
        sample = [table[:search_iterations] for table in ids]
        plan, result = neuroshard.plan(cardinalities, sample, n_ps, dim, models)
        account = {"plan": plan.to_dict(), **neuroshard.account(result)}
    account = world.bcast(account, root=0)
    return ShardPlan.from_dict(account["plan"]), account


def run(*, tasks=TASKS, ps_counts=(2, 4), planners=ALL_PLANNERS, batch: int = 4096, iterations: int = 30,
        scale: float = 0.001, transport: str = "rma", seed: int = 0, cost_model=None, search_iterations: int = 6,
        collect: dict | None = None, say=lambda line: None) -> dict | None:
    """Every planner's per-rank cost on every task and PS count; the result on rank 0 (collective)."""
    from mpi4py import MPI

    from hybrid.runtime.rma_store import EmbeddingStore

    world = MPI.COMM_WORLD
    if world.size < 1 + max(ps_counts):
        raise ValueError(f"hybrid bench sharding needs 1 worker + {max(ps_counts)} PS ranks: "
                         f"launch/mpirun.sh -n {1 + max(ps_counts)} python -m hybrid bench sharding")
    unknown = [p for p in planners if p not in ALL_PLANNERS]
    if unknown:
        raise ValueError(f"unknown planners {unknown}; expected some of {', '.join(ALL_PLANNERS)}")
    models, model_info = (None, {})
    if "neuroshard" in planners:
        models, model_info = _cost_models(world, cost_model, dict(collect or {}, batch=batch, scale=scale,
                                                                   seed=seed), say)
    cases, searches = [], []
    for n_tables, dim in tasks:
        cardinalities, ids = table_ids(task_profile(n_tables), scale=scale, batch=batch,
                                       iterations=iterations + search_iterations, seed=seed)
        batches = global_batches(cardinalities, [table[search_iterations:] for table in ids])  # unseen by search
        for n_ps in ps_counts:
            ps_ranks = list(range(world.size - n_ps, world.size))
            stores = {}
            for planner in planners:  # every plan's store at once (collective, in the same order everywhere)
                if planner == "neuroshard":
                    plan, account = _neuroshard_plan(world, models, cardinalities, ids, n_ps, dim, search_iterations)
                    searches.append({"tables": n_tables, "dim": dim, "ps": n_ps, **{k: v for k, v in account.items()
                                                                                      if k != "plan"}})
                else:
                    plan = make_plan(planner, cardinalities, n_ps, dim=dim, seed=seed)
                stores[planner] = (plan, EmbeddingStore(world, ps_ranks, plan.n_rows, dim, transport=transport,
                                                        plan=plan))
            if world.rank == 0:
                timed, together = _time_ranks(stores, batches, dim)
                for planner, (plan, _) in stores.items():
                    served = shard_load(plan, batches).tolist()
                    cases.append({"tables": n_tables, "dim": dim, "ps": n_ps, "planner": planner,
                                  "max_ms": max(timed[planner]), "ranks_ms": timed[planner],
                                  "all_ms": together[planner], "rows_served": [round(x, 1) for x in served],
                                  "rows_per_rank": plan.sizes.tolist()})
                    say(format_case(cases[-1]))
            for _, store in stores.values():
                store.barrier()
                store.close()
    if world.rank != 0:
        return None
    return {"batch": batch, "iterations": iterations, "scale": scale, "transport": transport, "cases": cases,
            "best": best_per_task(cases), "cost_models": model_info, "searches": searches}


def best_per_task(cases: list[dict]) -> list[dict]:
    """Per (tables, dim, PS count): each planner's slowest-rank cost over the default plan's, and the
    cost-model planner's slowest-rank and all-ranks costs over the best baseline's."""
    out = []
    for key in sorted({(c["tables"], c["dim"], c["ps"]) for c in cases}):
        mine = [c for c in cases if (c["tables"], c["dim"], c["ps"]) == key]
        default = next(c["max_ms"] for c in mine if c["planner"] == "row-ranges")
        row = {"tables": key[0], "dim": key[1], "ps": key[2],
               "vs_row_ranges": {c["planner"]: round(c["max_ms"] / default, 3) if default else None for c in mine}}
        baselines = [c for c in mine if c["planner"] != "neuroshard"]
        ours = next((c for c in mine if c["planner"] == "neuroshard"), None)
        if ours is not None and baselines:
            best = min(baselines, key=lambda c: c["max_ms"])
            best_all = min(baselines, key=lambda c: c["all_ms"])
            row.update(best_baseline=best["planner"], neuroshard_vs_best=round(ours["max_ms"] / best["max_ms"], 3),
                       best_baseline_all=best_all["planner"],
                       neuroshard_all_vs_best=round(ours["all_ms"] / best_all["all_ms"], 3))
        out.append(row)
    return out


def format_case(case: dict) -> str:
    return (f"{case['tables']:>4} tables dim {case['dim']:>3} on {case['ps']} PS  {case['planner']:<12} "
            f"slowest rank {case['max_ms']:7.3f} ms, all at once {case['all_ms']:7.3f} ms  "
            f"(ranks {case['ranks_ms']}, distinct rows {case['rows_served']})")


def format_table(result: dict) -> str:
    planners = list(next(iter(result["best"]))["vs_row_ranges"]) if result["best"] else []
    ours = any("neuroshard_vs_best" in row for row in result["best"])
    lines = [f"{'tables':>6}{'dim':>5}{'ps':>4}" + "".join(f"{p:>13}" for p in planners)
             + (f"  {'best baseline':<14}{'ours/best':>10}{'all: ours/best':>16}{'search s':>10}" if ours else "")]
    searches = {(r["tables"], r["dim"], r["ps"]): r for r in result.get("searches", [])}
    for row in result["best"]:
        line = (f"{row['tables']:>6}{row['dim']:>5}{row['ps']:>4}"
                + "".join(f"{row['vs_row_ranges'][p]:>13.3f}" for p in planners))
        if "neuroshard_vs_best" in row:
            search = searches.get((row["tables"], row["dim"], row["ps"]), {})
            line += (f"  {row['best_baseline']:<14}{row['neuroshard_vs_best']:>10.3f}"
                     f"{row['neuroshard_all_vs_best']:>16.3f}{search.get('search_seconds', 0.0):>10.2f}")
        lines.append(line)
    text = ("slowest PS rank's time per iteration over the default row ranges' (lower is better)"
            + ("; ours/best: neuroshard's slowest rank over the best baseline's; all: every rank at once" if ours
               else "") + "\n" + "\n".join(lines))
    fits = result.get("cost_models", {})
    if "serving_fit" in fits:
        text += (f"\ncost models: {fits['serving_samples']} serving and {fits['comm_samples']} communication samples "
                 f"collected in {fits['collect_seconds']} s, trained in {fits['train_seconds']} s; held-out mean "
                 f"relative error {fits['serving_fit']['held_out_mean_relative_error']:.3f} (serving), "
                 f"{fits['comm_fit']['held_out_mean_relative_error']:.3f} (communication)")
    return text


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
