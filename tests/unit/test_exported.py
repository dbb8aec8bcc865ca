"""An exported model (hybrid.exported): what it computes, and what it refuses."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid.config import load_config
from hybrid.data.synthetic import synthesize
from hybrid.data.store import BatchStore
from hybrid.exported import auc_and_logloss, evaluate, load, save
from hybrid.models import build_model


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("exported") / "store"
    synthesize(path, like="criteo-kaggle", rows=500, scale=0.0005, seed=2)
    return BatchStore(path)


def _export(store, path, precision="float32"):
    config = load_config(None, [f"model.precision={precision}", "model.embedding_dim=4", "seed=5"])
    model = build_model(config.model, n_dense=store.n_dense, n_tables=store.n_tables, seed=5)
    dtype = np.dtype(precision)
    table = np.random.default_rng(0).normal(size=(int(store.cardinalities.sum()), 4)).astype(dtype)
    save(path, config=config.to_dict(), model_state=model.state_dict(), embeddings=table,
         table_offsets=store.table_offsets, n_dense=store.n_dense, step=3)
    return model, table


@pytest.mark.parametrize("precision", ["float32", "float64"])
def test_the_loaded_model_computes_the_trained_model_on_the_global_rows_of_each_table(store, tmp_path, precision):
    model, table = _export(store, tmp_path / "m.pt", precision)
    loaded = load(tmp_path / "m.pt")
    batch = store.gather(0, np.arange(50))
    dtype = getattr(torch, precision)
    rows = torch.from_numpy(table[batch.sparse.astype(np.int64) + store.table_offsets])
    want = model(torch.from_numpy(batch.dense).to(dtype), rows)
    got = loaded(torch.from_numpy(batch.dense).to(dtype), torch.from_numpy(batch.sparse))
    assert torch.equal(got, want.detach())
    assert not loaded.training and not any(p.requires_grad for p in loaded.embeddings.parameters())
    result = evaluate(loaded, store, limit=200)
    assert result["samples"] == 200 and 0.0 <= result["auc"] <= 1.0


def test_a_file_that_is_not_an_export_and_a_store_of_other_tables_are_refused(store, tmp_path):
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a model written by hybrid export"):
        load(tmp_path / "other.pt")
    _export(store, tmp_path / "m.pt")
    other = tmp_path / "other-store"
    synthesize(other, like="avazu", rows=100, scale=0.0005, seed=2)
    with pytest.raises(ValueError, match="the model was trained on 26 tables"):
        evaluate(load(tmp_path / "m.pt"), BatchStore(other))


def test_a_diverged_model_scores_nan_and_says_how_many_outputs_were_not_finite():
    labels = np.array([0.0, 1.0, 1.0, 0.0])
    assert auc_and_logloss(labels, np.array([0.1, 0.9, 0.8, 0.3]))["auc"] == 1.0
    diverged = auc_and_logloss(labels, np.array([0.1, np.nan, 0.8, np.nan]))
    assert diverged["nonfinite"] == 2 and np.isnan(diverged["auc"]) and np.isnan(diverged["logloss"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 12)), min_size=1, max_size=300),
       st.sampled_from([np.float32, np.float64]))
def test_auc_and_log_loss_equal_scikit_learns_with_ties_and_one_class(pairs, dtype):
    from sklearn.metrics import log_loss, roc_auc_score

    labels = np.array([label for label, _ in pairs])
    probabilities = (np.array([score for _, score in pairs]) / 12).astype(dtype)  # few values: many ties, 0 and 1
    got = auc_and_logloss(labels, probabilities)
    clipped = np.clip(probabilities, 1e-7, 1 - 1e-7)
    # float32 outputs: scikit-learn takes their logarithms in float32, this in float64
    precision = 1e-6 if dtype == np.float32 else 1e-12
    assert got["logloss"] == pytest.approx(log_loss(labels, clipped, labels=[0, 1]), rel=precision)
    if len(np.unique(labels)) == 2:
        assert got["auc"] == pytest.approx(roc_auc_score(labels, probabilities), rel=1e-12)
    else:
        assert np.isnan(got["auc"])
