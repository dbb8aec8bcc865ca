"""The embedding store across ranks, on both transports: reads, exclusive writes, concurrent sums.

PS ranks serve packed transfers only inside ``store.barrier()``, so that is
the barrier these tests use between phases.
"""
import numpy as np
import pytest
from mpi4py import MPI

from hybrid.runtime.embedding_init import fill_initial_runs, initial_rows
from hybrid.runtime.rma_store import EmbeddingStore
from hybrid.runtime.shard_plan import Columns, ShardPlan

pytestmark = pytest.mark.family  # MPI semantics themselves: launch/test.sh runs these under MPICH too

N_ROWS, DIM = 103, 6
TRANSPORTS = pytest.mark.parametrize("transport", ["rma", "packed"])


def _init(rows):
    return initial_rows(7, rows, DIM, np.float64)


def _fill(shard, runs):
    fill_initial_runs(shard, 7, runs)


def _plan(layout: str, n_ps: int):
    """The default row ranges, or three tables (40, 13, 50 rows) placed whole, dealt round-robin or
    split into column slices (halves and thirds: slices of two widths share a shard)."""
    if layout == "row-ranges":
        return None
    offsets = [0, 40, 53, N_ROWS]
    if layout == "whole-tables":
        return ShardPlan.from_tables(offsets, [n_ps - 1, 0, n_ps - 1], n_ps, layout)
    if layout == "column-slices":
        last = n_ps - 1
        return ShardPlan.from_tables(offsets, [Columns((last, 0)), 0, Columns((0, last, 0))], n_ps, layout, dim=DIM)
    return ShardPlan.from_tables(offsets, [list(range(n_ps)), n_ps - 1, list(reversed(range(n_ps)))], n_ps, layout)


def _holds_its_plans_values(shard, runs) -> bool:
    """A PS shard holds, at each run's local rows, its rows' initial values (their columns, for a slice)."""
    for start, first, count, stride, col_lo, width in runs:
        rows = first + stride * np.arange(count)
        held = shard.reshape(-1, width or DIM)[start:start + count]
        if not np.array_equal(held, _init(rows)[:, col_lo:col_lo + (width or DIM)]):
            return False
    return True


@pytest.mark.shape
@TRANSPORTS
@pytest.mark.parametrize("layout", ["row-ranges", "whole-tables", "round-robin", "column-slices"])
@pytest.mark.parametrize("n_ps", [pytest.param(1, marks=pytest.mark.mpi(min_size=2)),
                                  pytest.param(2, marks=pytest.mark.mpi(min_size=3))])  # at least one worker
def test_workers_read_sum_and_overwrite_rows_of_every_shard(n_ps, transport, layout):
    """The store serves the same rows whatever the shard plan."""
    world = MPI.COMM_WORLD
    ps_ranks = list(range(world.size - n_ps, world.size))
    workers = [r for r in range(world.size) if r not in ps_ranks]
    store = EmbeddingStore(world, ps_ranks, N_ROWS, DIM, dtype=np.float64, init=_fill, transport=transport,
                           plan=_plan(layout, n_ps))
    if world.rank in ps_ranks:  # each PS rank holds its plan's rows, in its plan's local order
        assert _holds_its_plans_values(store.shard, store.plan.runs(ps_ranks.index(world.rank)))
    rows = np.array([0, 102, 51, 52, 5, 99, 50], dtype=np.int64)  # spans both shards, unsorted
    got = np.empty((len(rows), DIM))
    if world.rank in workers:
        store.pull(rows, got).wait()
        parts = np.zeros((len(rows), DIM))
        for s in range(n_ps):  # each shard's share of the rows (whole rows or slices) adds up to the rows
            share = np.zeros((len(rows), DIM))
            store.pull(rows, share, only=s).wait()
            parts += share
        assert np.allclose(parts, _init(rows), rtol=0, atol=1e-15)
    store.barrier()  # every first read completes before anyone adds: else a worker could read a sum
    if world.rank in workers:
        # every worker adds (its rank + 1) to shared rows, concurrently
        store.accumulate(rows, np.full((len(rows), DIM), world.rank + 1.0)).wait()
    store.barrier()
    if world.rank == workers[0]:
        summed = np.empty((len(rows), DIM))
        store.pull(rows, summed).wait()
        assert np.allclose(summed, _init(rows) + sum(w + 1.0 for w in workers), rtol=0, atol=1e-12)
        exclusive = np.array([3, 60], dtype=np.int64)
        store.put(exclusive, np.full((2, DIM), -4.0)).wait()
        everything = store.read_all()
        assert (everything[[3, 60]] == -4.0).all()
        untouched = np.setdiff1d(np.arange(N_ROWS), np.concatenate([rows, exclusive]))
        assert np.array_equal(everything[untouched], _init(untouched))
    store.close()
    if world.rank in workers:
        assert np.array_equal(got, _init(rows))


@TRANSPORTS
@pytest.mark.parametrize("poll_seconds", [None, 0.0])  # the PS sleeps between tests, or never (a core of its own)
@pytest.mark.mpi(min_size=2)
def test_every_worker_sees_the_same_table_after_a_barrier(transport, poll_seconds):
    world = MPI.COMM_WORLD
    store = EmbeddingStore(world, [world.size - 1], N_ROWS, DIM, dtype=np.float32,
                           init=lambda shard, runs: fill_initial_runs(shard, 1, runs), transport=transport,
                           poll_seconds=poll_seconds)
    digest = None
    if world.rank != world.size - 1:
        mine = np.arange(world.rank, N_ROWS, world.size - 1)
        store.accumulate(mine, np.ones((len(mine), DIM), np.float32)).wait()
    store.barrier()
    if world.rank == world.size - 1:  # the PS leaves the barrier with every worker's sums in its shard
        expected = initial_rows(1, np.arange(N_ROWS), DIM, np.float32) + 1
        assert np.array_equal(store.shard.reshape(N_ROWS, DIM), expected)
    if world.rank != world.size - 1:
        digest = store.read_all().tobytes()
    store.barrier()
    seen = [d for d in world.allgather(digest) if d is not None]
    assert len(seen) == world.size - 1 and len(set(seen)) == 1
    store.close()


@TRANSPORTS
@pytest.mark.mpi(min_size=2)
def test_bad_requests_are_explained(transport):
    world = MPI.COMM_WORLD
    store = EmbeddingStore(world, [world.size - 1], 10, DIM, transport=transport)
    if world.rank == 0:
        with pytest.raises(ValueError, match=r"rows must be in \[0, 10\)"):
            store.pull(np.array([10]), np.empty((1, DIM), np.float32))
        with pytest.raises(ValueError, match="expected"):
            store.put(np.array([1]), np.empty((1, DIM + 1), np.float32))
    store.close()


@pytest.mark.mpi(min_size=2)
def test_auto_picks_one_sided_operations_on_one_host():
    world = MPI.COMM_WORLD
    store = EmbeddingStore(world, [world.size - 1], 10, DIM)
    assert store.transport == "rma"
    store.close()


@pytest.mark.shape
@pytest.mark.mpi(min_size=3)
def test_packed_accumulate_adds_duplicate_rows_and_concurrent_writers_like_mpi_accumulate():
    world = MPI.COMM_WORLD
    store = EmbeddingStore(world, [world.size - 1], N_ROWS, DIM, dtype=np.float64, transport="packed")
    rows = np.array([4, 4, 9, 100, 4], dtype=np.int64)
    if world.rank != world.size - 1:
        store.accumulate(rows, np.ones((len(rows), DIM))).wait()
    store.barrier()
    if world.rank == 0:
        table = store.read_all()
        workers = world.size - 1
        assert (table[4] == 3 * workers).all() and (table[9] == workers).all() and (table[100] == workers).all()
        assert not table[np.setdiff1d(np.arange(N_ROWS), rows)].any()
    store.close()
