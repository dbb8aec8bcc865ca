"""BSP modes (HET with staleness 0 among them) equal the single-process reference (docs/design.md section 9), across ranks.

World size N runs N-1 workers + 1 PS and N-2 workers + 2 PS (launch/test.sh
runs N = 4, and N = 3 and 5 for the tests marked ``shape``: 1-4 workers, 1-2 PS), float64, a cache small enough that
it evicts: final embedding tables and MLP weights must equal plain torch SGD
on the whole global batch within 1e-9.
"""
from pathlib import Path

import numpy as np
import pytest
import torch
from mpi4py import MPI

import distributed_run
from hybrid import modes
from hybrid.bench import case_overrides
from hybrid.config import load_config
from hybrid.data.store import BatchStore
from hybrid.runtime.shard_plan import Columns, ShardPlan
from hybrid.scheduling.policy import Sync
from hybrid.sharding.planners import make_plan
from mode_cases import mode_cases
from shared_store import shared_store

ITERATIONS = 25


@pytest.fixture(scope="module")
def store_path():
    with shared_store(like="criteo-kaggle", rows=4000, scale=0.001, seed=5) as path:
        yield path


# Every model reads the same [batch, tables, dim] rows, so which rows move between which ranks, the
# part that depends on the shape, does not depend on the model: at 3 and 5 ranks (and under MPICH) the
# modes run with the two models whose MLPs differ most (DLRM's bottom MLP and interaction; NCF, which
# reads no dense features); the full product runs on 4 ranks.
SHAPE_MODELS = [pytest.param(m, marks=pytest.mark.shape) if m in ("dlrm", "ncf") else m
                for m in ("dlrm", "wide_deep", "deepfm", "dcn", "ncf")]


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", mode_cases())
@pytest.mark.parametrize("model", SHAPE_MODELS)
@pytest.mark.parametrize("n_ps", [1, 2])
def test_bsp_modes_equal_the_single_process_reference(store_path, mode, model, n_ps):
    """Every registered mode the reference repeats, and each of its variants (tests/mpi/mode_cases.py)."""
    world = MPI.COMM_WORLD
    config = load_config(None, [f"data.path={store_path}", f"cluster.workers={world.size - n_ps}",
                                f"cluster.ps={n_ps}", "train.batch_per_worker=8", "cache.ratio=0.008",
                                *case_overrides(mode), f"model.name={model}", "model.precision=float64",
                                "model.embedding_dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]",
                                "train.embedding_lr=0.1", "train.dense_lr=0.05", "seed=11"])
    store = BatchStore(store_path)
    run = distributed_run.train(config, store, ITERATIONS)
    if world.rank == 0:
        distributed_run.assert_equals_reference(run, config, store, ITERATIONS)
        assert len(run.log) == ITERATIONS
        if modes.get(config.scheduler.mode).schedule.sync is Sync.on_demand:  # dirty rows stay in caches
            evictions = sum(r["counts"]["writeback"] for r in run.log)
            assert evictions > 0, "the cache must evict dirty rows for this test to mean anything"


def _small_float64_run(store_path, n_ps: int, *overrides) -> distributed_run.Run:
    """Train 25 iterations of a small float64 model with ``overrides``; worker 0 compares with the reference."""
    world = MPI.COMM_WORLD
    config = load_config(None, [f"data.path={store_path}", f"cluster.workers={world.size - n_ps}",
                                f"cluster.ps={n_ps}", "train.batch_per_worker=8", "cache.ratio=0.008",
                                "model.precision=float64", "model.embedding_dim=4", "model.bottom_mlp=[8]",
                                "model.top_mlp=[8]", "train.embedding_lr=0.1", "train.dense_lr=0.05", "seed=11",
                                *overrides])
    store = BatchStore(store_path)
    run = distributed_run.train(config, store, ITERATIONS)
    if world.rank == 0:
        distributed_run.assert_equals_reference(run, config, store, ITERATIONS)
    return run


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
def test_auto_where_horovod_cannot_be_imported_sums_by_mpi_and_equals_the_reference(store_path, monkeypatch):
    """The GPU check trains before Horovod is built: train.allreduce=auto then takes MPI's collectives on every
    worker, for the MLP and for row-wise Adagrad's shared rows alike."""
    import importlib.util

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "horovod" else found(name, *args))
    run = _small_float64_run(store_path, 1, "scheduler.mode=vanilla", "train.embedding_optimizer=rowwise_adagrad",
                             "train.allreduce=auto", "train.device=cpu")
    workers = ", ".join(str(w) for w in range(MPI.COMM_WORLD.size - 1))
    if MPI.COMM_WORLD.rank < MPI.COMM_WORLD.size - 1:
        assert run.allreduce == ("MPI reduce-scatter and allgather of one host buffer on the workers' communicator: "
                                 f"Horovod is not installed (worker(s) {workers})")


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["vanilla", "herald", "het", "vanilla+train.embedding_optimizer=rowwise_adagrad"])
@pytest.mark.parametrize("allreduce", ["host", "mpi"])
def test_the_host_staged_allreduce_equals_the_reference(store_path, mode, allreduce):
    """The fallback for workers that share a GPU (host), and the sum without Horovod (mpi: MPICH where ranks
    share cores, or no Horovod installed), run on CPU workers: the same model as Horovod's sum. Row-wise
    Adagrad in vanilla also sums the shared rows' gradients over the workers."""
    _small_float64_run(store_path, 1, *case_overrides(mode), f"train.allreduce={allreduce}", "train.device=cpu")


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["vanilla", "herald", "herald+scheduler.sync=p2p"])
@pytest.mark.parametrize("transport", ["rma", "packed"])
@pytest.mark.parametrize("n_ps", [1, 2])
def test_rowwise_adagrad_equals_the_single_process_reference_rows_and_accumulators(store_path, mode, transport,
                                                                                     n_ps):
    """Shared rows updated once from their summed gradient; every row's accumulator checked with its values."""
    _small_float64_run(store_path, n_ps, *case_overrides(mode), "train.embedding_optimizer=rowwise_adagrad",
                       f"cluster.transport={transport}")


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU workers need a CUDA device (none here)")
@pytest.mark.parametrize("mode", ["vanilla", "herald", "het"])
@pytest.mark.parametrize("model", ["dlrm", "wide_deep", "deepfm", "dcn", "ncf"])
@pytest.mark.parametrize("n_ps", [1, 2])
def test_gpu_workers_equal_the_single_process_reference(store_path, mode, model, n_ps):
    """train.device=cuda: model, inputs and embedding leaf on the GPU; the PS and the cache in host memory."""
    _small_float64_run(store_path, n_ps, f"scheduler.mode={mode}", f"model.name={model}", "train.device=cuda")


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["vanilla", "herald", "herald+scheduler.order=confident",
                                  "herald+scheduler.scoring=cost+scheduler.order=confident",
                                  "herald+scheduler.scoring=cost+scheduler.swap_rounds=2+scheduler.lookahead=true",
                                  "laia+scheduler.scoring=cost", "het"])
@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "serial"])
@pytest.mark.parametrize("transport", ["rma", "packed"])
def test_exact_under_heavy_cache_churn(store_path, mode, overlap, transport):
    """A cache of exactly one working set: every iteration evicts, write-backs race prefetches."""
    world = MPI.COMM_WORLD
    iterations = 40
    config = load_config(None, [f"data.path={store_path}", f"cluster.workers={world.size - 1}", "cluster.ps=1",
                                "train.batch_per_worker=8", "cache.ratio=0.0061", *case_overrides(mode),
                                "model.name=dlrm", "model.precision=float64", "model.embedding_dim=4",
                                "model.bottom_mlp=[8]", "model.top_mlp=[8]", "train.embedding_lr=0.1",
                                "train.dense_lr=0.05", "seed=3", f"train.overlap={overlap}",
                                f"cluster.transport={transport}"])
    store = BatchStore(store_path)
    run = distributed_run.train(config, store, iterations)
    prefetched = world.allreduce(sum(r["prefetched"] for r in run.log))
    if world.rank == 0:
        assert run.capacity == 8 * 26, "the cache holds exactly one iteration's working set"
        distributed_run.assert_equals_reference(run, config, store, iterations)
        pulls = sum(r["counts"]["pull"] for r in run.log)
        if overlap:
            assert 0.2 * pulls < prefetched < pulls, "overlap must read a real share of the rows ahead"
        else:
            assert prefetched == 0
        if mode.startswith("herald"):
            assert sum(r["counts"]["writeback"] for r in run.log) > 100


def _sliced_plan(cardinalities, n_ps: int, dim: int) -> ShardPlan:
    """Tables in turn split into column halves and quarters over the PS ranks, whole, and dealt by rows."""
    placements = []
    for t in range(len(cardinalities)):
        kind = t % 4
        if kind in (0, 1):
            parts = 2 if kind == 0 else 4
            placements.append(Columns(tuple((t + j) % n_ps for j in range(parts))))
        else:
            placements.append(t % n_ps if kind == 2 else list(range(n_ps)))
    offsets = [0, *np.cumsum(cardinalities).tolist()]
    return ShardPlan.from_tables(offsets, placements, n_ps, "column-slices", dim=dim)


@pytest.mark.shape
@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("planner", ["round-robin", "size", "random", "column-slices"])
@pytest.mark.parametrize("transport", ["rma", "packed"])
def test_exact_under_any_shard_plan(store_path, planner, transport):
    """Tables placed whole, their rows dealt over the PS ranks, or their columns sliced: the same model."""
    world = MPI.COMM_WORLD
    n_ps = 2
    plan_path = Path(store_path).parent / f"plan-{planner}.json"
    overrides = [f"data.path={store_path}", f"cluster.workers={world.size - n_ps}", f"cluster.ps={n_ps}",
                 "train.batch_per_worker=8", "cache.ratio=0.008", "scheduler.mode=herald", "model.name=dlrm",
                 "model.precision=float64", "model.embedding_dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]",
                 "train.embedding_lr=0.1", "train.dense_lr=0.05", "seed=13", f"cluster.transport={transport}",
                 f"cluster.shard_plan={plan_path}"]
    config = load_config(None, overrides)
    store = BatchStore(store_path)
    plan = make_plan(planner, store.cardinalities, n_ps, dim=4, seed=13) if planner != "column-slices" else \
        _sliced_plan(store.cardinalities, n_ps, dim=4)
    if world.rank == 0:
        plan.save(plan_path)
    world.Barrier()
    run = distributed_run.train(config, store, 30)
    assert run.plan_fingerprint == plan.fingerprint != ShardPlan.contiguous(plan.n_rows, n_ps).fingerprint
    if world.rank == 0:
        distributed_run.assert_equals_reference(run, config, store, 30)


@pytest.mark.shape
@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["plan", "herald"])
@pytest.mark.parametrize("ratio", [0.008, 0.0061], ids=["evicting", "one-working-set"])
def test_p2p_plans_equal_the_single_process_reference(store_path, mode, ratio):
    """Rows sent cache to cache land where the receiver's write-backs have already copied their slots."""
    world = MPI.COMM_WORLD
    iterations = 40
    config = load_config(None, [f"data.path={store_path}", f"cluster.workers={world.size - 1}", "cluster.ps=1",
                                "train.batch_per_worker=8", f"cache.ratio={ratio}", f"scheduler.mode={mode}",
                                "scheduler.sync=p2p", "model.name=dlrm", "model.precision=float64",
                                "model.embedding_dim=4", "model.bottom_mlp=[8]", "model.top_mlp=[8]",
                                "train.embedding_lr=0.1", "train.dense_lr=0.05", "seed=7"])
    store = BatchStore(store_path)
    run = distributed_run.train(config, store, iterations)
    received = world.allreduce(sum(r["moved"]["p2p"] for r in run.log))
    if world.rank == 0:
        distributed_run.assert_equals_reference(run, config, store, iterations)
        assert received == sum(r["counts"]["p2p"] for r in run.log) > 0
        assert sum(r["counts"]["writeback"] for r in run.log) > 0
