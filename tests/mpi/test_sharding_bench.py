"""``hybrid bench sharding`` through the real store: every plan's ranks serve exactly the batch's rows."""
import numpy as np
import pytest
from mpi4py import MPI

from hybrid.bench import sharding_bench
from hybrid.sharding import tasks as sharding_tasks


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(120)
def test_every_plan_is_timed_per_rank_and_its_ranks_share_the_batch():
    tasks, iterations = ((8, 4),), 3
    result = sharding_bench.run(tasks=tasks, ps_counts=(2,), planners=("row-ranges", "round-robin", "size"),
                                batch=512, iterations=iterations, search_iterations=0)
    if MPI.COMM_WORLD.rank != 0:
        assert result is None
        return
    cardinalities, batches = sharding_tasks.task_batches(8, scale=0.001, batch=512, iterations=iterations, seed=0)
    distinct = np.mean([len(b) for b in batches])
    assert [c["planner"] for c in result["cases"]] == ["row-ranges", "round-robin", "size"]
    for case in result["cases"]:
        assert len(case["ranks_ms"]) == 2 and case["max_ms"] == max(case["ranks_ms"]) > 0
        assert sum(case["rows_served"]) == pytest.approx(distinct, abs=0.2)
        assert sum(case["rows_per_rank"]) == sum(cardinalities)
    assert result["best"][0]["vs_row_ranges"]["row-ranges"] == 1.0


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(180)
def test_cost_data_is_measured_through_the_store_and_the_cost_model_planner_is_timed_beside_the_baselines():
    collect = {"serving_samples": 12, "comm_samples": 6, "iterations": 3, "max_tables": 4}
    result = sharding_bench.run(tasks=((8, 16),), ps_counts=(2,), planners=("row-ranges", "size", "neuroshard"),
                                batch=512, iterations=3, search_iterations=2, collect=collect)
    if MPI.COMM_WORLD.rank != 0:
        assert result is None
        return
    fits = result["cost_models"]
    assert fits["serving_samples"] == 12 and fits["comm_samples"] == 6
    assert fits["serving_fit"]["n_held_out"] > 0 and fits["serving_fit"]["held_out_mean_relative_error"] >= 0
    ours = next(c for c in result["cases"] if c["planner"] == "neuroshard")
    assert sum(ours["rows_served"]) > 0 and ours["max_ms"] == max(ours["ranks_ms"]) > 0 and ours["all_ms"] > 0
    search = result["searches"][0]
    assert search["search_seconds"] > 0 and search["evaluations"] > 0
    row = result["best"][0]
    best = min((c for c in result["cases"] if c["planner"] != "neuroshard"), key=lambda c: c["max_ms"])
    assert row["best_baseline"] == best["planner"]
    assert row["neuroshard_vs_best"] == pytest.approx(ours["max_ms"] / best["max_ms"], abs=1e-3)
