"""``hybrid bench sharding`` through the real store: every plan's ranks serve exactly the batch's rows."""
import numpy as np
import pytest
from mpi4py import MPI

from hybrid.bench import sharding_bench


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(120)
def test_every_plan_is_timed_per_rank_and_its_ranks_share_the_batch():
    tasks, iterations = ((8, 4),), 3
    result = sharding_bench.run(tasks=tasks, ps_counts=(2,), planners=("row-ranges", "round-robin", "size"),
                                batch=512, iterations=iterations)
    if MPI.COMM_WORLD.rank != 0:
        assert result is None
        return
    cardinalities, batches = sharding_bench.task_batches(8, scale=0.001, batch=512, iterations=iterations, seed=0)
    distinct = np.mean([len(b) for b in batches])
    assert [c["planner"] for c in result["cases"]] == ["row-ranges", "round-robin", "size"]
    for case in result["cases"]:
        assert len(case["ranks_ms"]) == 2 and case["max_ms"] == max(case["ranks_ms"]) > 0
        assert sum(case["rows_served"]) == pytest.approx(distinct, abs=0.2)
        assert sum(case["rows_per_rank"]) == sum(cardinalities)
    assert result["best"][0]["vs_row_ranges"]["row-ranges"] == 1.0
