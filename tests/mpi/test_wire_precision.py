"""A 16-bit wire (``cluster.wire_precision=bf16``) trains the model its rounding reference defines (docs/design.md
section 14), across ranks, on both transports.

Each mode that supports the wire (HET at staleness 0), float64, a cache small enough that it evicts: the final
embedding table and MLP must equal ``train_wire_reference`` (the same roundings at the same points, taken from every
worker's plans) within 1e-9, and differ from the fp32 reference by far more (over 1e-6), so the roundings are really
there. Every case runs on 3, 4 and 5 ranks (``shape``): 1 to 4 workers, 1 and 2 PS ranks.
"""
import numpy as np
import pytest
import torch
from mpi4py import MPI

import distributed_run
from hybrid import modes
from hybrid.bench import case_overrides
from hybrid.config import load_config
from hybrid.data.store import BatchStore
from hybrid.scheduling.policy import Sync
from hybrid.training.reference import train_wire_reference
from mode_cases import mode_cases
from shared_store import shared_store

ITERATIONS = 25
CASES = mode_cases(sixteen_bit_wire=True)  # every mode whose transfers round as section 14 defines, and its variants


@pytest.fixture(scope="module")
def store_path():
    with shared_store(like="criteo-kaggle", rows=4000, scale=0.001, seed=5) as path:
        yield path


def _config(store_path, n_ps: int, *overrides):
    world = MPI.COMM_WORLD
    return load_config(None, [f"data.path={store_path}", f"cluster.workers={world.size - n_ps}",
                              f"cluster.ps={n_ps}", "train.batch_per_worker=8", "cache.ratio=0.008",
                              "model.name=dlrm", "model.precision=float64", "model.embedding_dim=4",
                              "model.bottom_mlp=[8]", "model.top_mlp=[8]", "train.embedding_lr=0.1",
                              "train.dense_lr=0.05", "seed=11", "cluster.wire_precision=bf16", *overrides])


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.shape
@pytest.mark.parametrize("mode", CASES)
@pytest.mark.parametrize("transport", ["rma", "packed"])
@pytest.mark.parametrize("n_ps", [1, 2])
def test_bf16_wire_equals_its_rounding_reference(store_path, mode, transport, n_ps):
    config = _config(store_path, n_ps, *case_overrides(mode), f"cluster.transport={transport}")
    store = BatchStore(store_path)
    run = distributed_run.train(config, store, ITERATIONS)
    if MPI.COMM_WORLD.rank == 0:
        expected = train_wire_reference(config, store, ITERATIONS)
        distributed_run.assert_equals_reference(run, config, store, ITERATIONS, expected=expected)
        unrounded, _ = distributed_run.reference(config, store, ITERATIONS)
        assert np.abs(run.table - unrounded).max() > 1e-6, "the wire must round what it carries"
        if modes.get(config.scheduler.mode).schedule.sync is Sync.on_demand:  # dirty rows stay in caches
            assert sum(r["counts"]["writeback"] for r in run.log) > 0, "the cache must evict dirty rows"


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["herald", "herald+scheduler.sync=p2p", "vanilla+train.deterministic=true"])
@pytest.mark.parametrize("transport", ["rma", "packed"])
def test_bf16_wire_under_heavy_cache_churn_keeps_every_cached_row_equal_to_the_ps(store_path, mode, transport):
    """A cache of exactly one working set, reads ahead: every fresh cached row equals its PS row to the bit
    at every iteration's end (``train.verify_cache``), and the model is the rounding reference's."""
    config = _config(store_path, 1, *case_overrides(mode), f"cluster.transport={transport}", "cache.ratio=0.0061",
                     "train.verify_cache=true", "train.overlap=true")
    store = BatchStore(store_path)
    run = distributed_run.train(config, store, 40)
    if MPI.COMM_WORLD.rank == 0:
        assert run.capacity == 8 * 26, "the cache holds exactly one iteration's working set"
        distributed_run.assert_equals_reference(run, config, store, 40,
                                                expected=train_wire_reference(config, store, 40))


@pytest.mark.mpi(min_size=3)
@pytest.mark.timeout(300)
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU workers need a CUDA device (none here)")
@pytest.mark.parametrize("mode", mode_cases(sixteen_bit_wire=True))
def test_gpu_workers_with_a_bf16_wire_equal_its_rounding_reference(store_path, mode):
    """train.device=cuda: the leaf and the MLP on the GPU, the 16-bit sum through host memory (launch/gpu_check.sh
    runs the cases marked cuda)."""
    config = _config(store_path, 1, *case_overrides(mode), "train.device=cuda")
    store = BatchStore(store_path)
    run = distributed_run.train(config, store, ITERATIONS)
    if MPI.COMM_WORLD.rank == 0:
        distributed_run.assert_equals_reference(run, config, store, ITERATIONS,
                                                expected=train_wire_reference(config, store, ITERATIONS))
