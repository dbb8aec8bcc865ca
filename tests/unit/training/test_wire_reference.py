"""The rounding reference (``train_wire_reference``): with nothing rounded it is the plain reference, so what it adds
is the roundings alone (docs/design.md section 14); the MPI runs are compared with it in
tests/mpi/test_wire_precision.py."""
import numpy as np
import pytest

from hybrid.config import load_config
from hybrid.data.store import BatchStore
from hybrid.data.synthetic import synthesize
from hybrid.training.reference import train_reference, train_wire_reference

ITERATIONS = 12


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("wire") / "store"
    synthesize(path, like="criteo-kaggle", rows=3000, scale=0.001, seed=5)
    return BatchStore(path)


def _config(store, wire: str, *overrides):
    return load_config(None, [f"data.path={store.path}", "cluster.workers=3", "train.batch_per_worker=8",
                              "cache.ratio=0.01", "model.precision=float64", "model.embedding_dim=4",
                              "model.bottom_mlp=[8]", "model.top_mlp=[8]", "seed=11",
                              f"cluster.wire_precision={wire}", *overrides])


@pytest.mark.parametrize("mode", ["vanilla", "herald", "het"])
def test_without_rounding_the_per_worker_reference_is_the_plain_one(store, mode):
    """The per-worker forward passes, gradient sums and row bookkeeping change nothing but summation order."""
    config = _config(store, "fp32", f"scheduler.mode={mode}")
    table, model = train_wire_reference(config, store, ITERATIONS)
    plain_table, plain_model = train_reference(config, store, ITERATIONS)
    assert np.abs(table - plain_table).max() < 1e-12
    for got, want in zip(model.parameters(), plain_model.parameters()):
        assert np.abs(got.detach().numpy() - want.detach().numpy()).max() < 1e-12


def test_bf16_rounds_what_travels_and_keeps_the_masters(store):
    """Rows trained move by about bfloat16's step; rows never trained keep their full-precision initial values."""
    config = _config(store, "bf16", "scheduler.mode=herald")
    table, _ = train_wire_reference(config, store, ITERATIONS)
    plain, _ = train_reference(config, store, ITERATIONS)
    moved = np.abs(table - plain).max(axis=1)
    assert 1e-5 < moved.max() < 1e-2
    trained = np.unique(np.concatenate([b.sparse.astype(np.int64) + store.table_offsets for b in
                                        store.batches(config.global_batch, stop_batch=ITERATIONS)]))
    untouched = np.setdiff1d(np.arange(len(table)), trained)
    assert len(untouched) and not moved[untouched].any()
