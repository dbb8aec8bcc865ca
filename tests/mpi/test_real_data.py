"""Training on the real MovieLens-100k (``hybrid fetch movielens-100k``), across ranks.

The data is real (100,000 ratings in time order, from RecBole's wheel on
PyPI; rank 0 fetches it into ``data/ml-100k`` once). In float64 both BSP
modes end with the single-process reference's model, the rows the store
moved equal the simulation, and Herald moves far fewer of them.
"""
from pathlib import Path

import pytest
from mpi4py import MPI

import distributed_run
from hybrid.config import Mode, load_config
from hybrid.data.fetch import fetch_movielens_100k
from hybrid.data.store import BatchStore
from hybrid.training.simulator import simulate_mode

ROOT = Path(__file__).resolve().parents[2]
ITERATIONS = 40


@pytest.fixture(scope="module")
def ml100k():
    path = ROOT / "data" / "ml-100k"
    world = MPI.COMM_WORLD
    if world.rank == 0:
        fetch_movielens_100k(path)  # keeps an existing store of the same file
    world.Barrier()
    return path


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
def test_both_modes_train_the_reference_model_and_herald_moves_fewer_rows(ml100k):
    world = MPI.COMM_WORLD
    store = BatchStore(ml100k, split="train", test_fraction=0.1)
    assert store.n_samples == 90_000 and store.table_names == ["user_id", "item_id"]
    results, configs = {}, {}
    for mode in ("vanilla", "herald"):
        configs[mode] = load_config(None, [
            f"data.path={ml100k}", f"cluster.workers={world.size - 1}", "cluster.ps=1", "model.name=ncf",
            "model.precision=float64", "model.embedding_dim=8", "model.bottom_mlp=[16]", "model.top_mlp=[16]",
            "train.batch_per_worker=32", "cache.ratio=0.1", f"scheduler.mode={mode}", "seed=5",
            "scheduler.warmup_iterations=0"])
        results[mode] = distributed_run.train(configs[mode], store, ITERATIONS)
    if world.rank == 0:
        for mode, run in results.items():
            distributed_run.assert_equals_reference(run, configs[mode], store, ITERATIONS)
            simulated = simulate_mode(configs[mode], store, Mode(mode), iterations=ITERATIONS)
            assert run.rows_moved == simulated.pulls + simulated.pushes, mode
        vanilla, herald = results["vanilla"].rows_moved, results["herald"].rows_moved
        assert herald < 0.75 * vanilla, f"herald moved {herald} rows, vanilla {vanilla}"
