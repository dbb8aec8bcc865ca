"""The embedding store across ranks, on both transports: reads, exclusive writes, concurrent sums.

PS ranks serve packed transfers only inside ``store.barrier()``, so that is
the barrier these tests use between phases.
"""
import numpy as np
import pytest
from mpi4py import MPI

from hybrid.embedding_init import fill_initial_rows, initial_rows
from hybrid.rma_store import EmbeddingStore, RowRanges

N_ROWS, DIM = 103, 6
TRANSPORTS = pytest.mark.parametrize("transport", ["rma", "packed"])


def _init(rows):
    return initial_rows(7, rows, DIM, np.float64)


def _fill(shard, first_row):
    fill_initial_rows(shard, 7, first_row)


@TRANSPORTS
@pytest.mark.parametrize("n_ps", [pytest.param(1, marks=pytest.mark.mpi(min_size=2)),
                                  pytest.param(2, marks=pytest.mark.mpi(min_size=3))])  # at least one worker
def test_workers_read_sum_and_overwrite_rows_of_every_shard(n_ps, transport):
    world = MPI.COMM_WORLD
    ps_ranks = list(range(world.size - n_ps, world.size))
    workers = [r for r in range(world.size) if r not in ps_ranks]
    store = EmbeddingStore(world, ps_ranks, N_ROWS, DIM, dtype=np.float64, init=_fill, transport=transport)
    rows = np.array([0, 102, 51, 52, 5, 99, 50], dtype=np.int64)  # spans both shards, unsorted
    got = np.empty((len(rows), DIM))
    if world.rank in workers:
        store.pull(rows, got).wait()
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
@pytest.mark.mpi(min_size=2)
def test_every_worker_sees_the_same_table_after_a_barrier(transport):
    world = MPI.COMM_WORLD
    store = EmbeddingStore(world, [world.size - 1], N_ROWS, DIM, dtype=np.float32,
                           init=lambda shard, first: fill_initial_rows(shard, 1, first), transport=transport)
    digest = None
    if world.rank != world.size - 1:
        mine = np.arange(world.rank, N_ROWS, world.size - 1)
        store.accumulate(mine, np.ones((len(mine), DIM), np.float32)).wait()
    store.barrier()
    if world.rank != world.size - 1:
        digest = store.read_all().tobytes()
    store.barrier()
    seen = [d for d in world.allgather(digest) if d is not None]
    assert len(seen) == world.size - 1 and len(set(seen)) == 1
    store.close()


def test_row_ranges_cover_every_row_once():
    ranges = RowRanges(103, 4)
    covered = np.concatenate([ranges.rows_of(s) for s in range(4)])
    assert np.array_equal(covered, np.arange(103))
    rows = np.arange(103)
    assert np.array_equal(ranges.shard_of(rows) * ranges.shard_rows + ranges.local(rows), rows)


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
