"""Synthetic data: seeded, chunk-independent, and with the structure it documents."""
import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from hybrid._ext.session_process import SessionProcess
from hybrid.data.access_stats import cooccurrence_ratio, locality_ratio, store_stats, top_share
from hybrid.data.store import BatchStore
from hybrid.data.synthetic import CRITEO_KAGGLE, PROFILES, SyntheticGenerator, synthesize, zipf_cdf


def test_session_process_does_not_depend_on_chunking():
    cdf = zipf_cdf(500, 0.8)
    whole = SessionProcess(seed=3, n_active=16, mean_length=5, context_cdf=cdf).take(1000)
    parts = SessionProcess(seed=3, n_active=16, mean_length=5, context_cdf=cdf)
    pieces = np.concatenate([parts.take(n) for n in (1, 99, 400, 500)])
    assert np.array_equal(whole, pieces) and parts.position == 1000
    other = SessionProcess(seed=4, n_active=16, mean_length=5, context_cdf=cdf).take(1000)
    assert not np.array_equal(whole, other)


def test_session_process_rejects_bad_arguments():
    with pytest.raises(ValueError, match="n_active"):
        SessionProcess(seed=0, n_active=0, mean_length=5, context_cdf=zipf_cdf(5, 1))
    with pytest.raises(ValueError, match="context_cdf"):
        SessionProcess(seed=0, n_active=2, mean_length=5, context_cdf=np.zeros((2, 2)))


def test_same_seed_same_store_other_seed_other_store(tmp_path):
    a = synthesize(tmp_path / "a", like="avazu", rows=5000, scale=0.001, seed=1)
    b = synthesize(tmp_path / "b", like="avazu", rows=5000, scale=0.001, seed=1)
    c = synthesize(tmp_path / "c", like="avazu", rows=5000, scale=0.001, seed=2)
    assert a["fingerprint"] == b["fingerprint"] != c["fingerprint"]


def test_chunks_must_be_consecutive():
    generator = SyntheticGenerator(CRITEO_KAGGLE, rows=100, scale=0.001)
    generator.chunk(0, 10)
    with pytest.raises(ValueError, match="consecutive"):
        generator.chunk(50, 10)


@pytest.mark.parametrize("like", sorted(PROFILES))
def test_every_profile_writes_a_valid_store(tmp_path, like):
    meta = synthesize(tmp_path / like, like=like, rows=3000, scale=0.01)
    store = BatchStore(tmp_path / like)
    profile = PROFILES[like]
    assert store.n_tables == len(profile.tables) and store.n_dense == profile.n_dense
    assert list(store.cardinalities) == meta["cardinalities"]
    assert (store.sparse() < store.cardinalities).all()
    assert abs(store.labels().mean() - profile.positive_rate) < 0.08


def test_small_tables_keep_their_size_and_big_ones_scale():
    generator = SyntheticGenerator(CRITEO_KAGGLE, rows=10, scale=0.001)
    sizes = dict(zip([t.name for t in CRITEO_KAGGLE.tables], generator.cardinalities))
    assert sizes["C9"] == 3 and sizes["C20"] == 4  # tiny fields do not shrink
    assert sizes["C3"] == round(10131227 * 0.001)
    assert sizes["C5"] == 32  # 305 rows would scale to 0.3: floor at 32


def test_skew_differs_between_tables(criteo_like):
    store = BatchStore(criteo_like)
    stats = {s.name: s for s in store_stats(store.sparse(), store.table_names, store.cardinalities, 1024)}
    # C3 (zipf 1.05, 10k rows) is far more concentrated than C14 (zipf 0.5, 27 rows)
    assert stats["C3"].top10_share > 0.75
    assert stats["C14"].top10_share < 0.35
    shares = [s.top10_share for s in stats.values()]
    assert max(shares) - min(shares) > 0.5


def test_overall_top_rows_take_most_accesses(criteo_like):
    store = BatchStore(criteo_like)
    counts = np.concatenate([np.bincount(store.sparse()[:, t], minlength=c)
                             for t, c in enumerate(store.cardinalities)])
    assert top_share(counts, 0.10) > 0.85  # the papers: top 10% of Criteo rows ~ 90% of accesses


def test_big_tables_have_rows_recurring_a_few_to_hundreds_of_times(criteo_like):
    store = BatchStore(criteo_like)
    stats = {s.name: s for s in store_stats(store.sparse(), store.table_names, store.cardinalities, 1024)}
    recurring = stats["C3"].recurrence["2-9"] + stats["C3"].recurrence["10-99"] + stats["C3"].recurrence["100-999"]
    assert recurring > 0.4


def test_coupled_tables_cooccur_and_uncoupled_do_not(criteo_like):
    sparse = BatchStore(criteo_like).sparse()
    index = {t.name: i for i, t in enumerate(CRITEO_KAGGLE.tables)}
    assert cooccurrence_ratio(sparse[:, index["C3"]], sparse[:, index["C12"]]) > 2.0  # couplings 0.9, 0.9
    assert abs(cooccurrence_ratio(sparse[:, index["C5"]], sparse[:, index["C9"]]) - 1.0) < 0.05  # 0.0, 0.0


def test_temporal_locality_present_in_file_order_and_gone_after_shuffle(criteo_like):
    store = BatchStore(criteo_like)
    c3 = [t.name for t in CRITEO_KAGGLE.tables].index("C3")
    in_order = store.sparse()[:, c3]
    shuffled = store.sparse()[store.order(shuffle=True, seed=1), c3]
    assert locality_ratio(in_order) > 3
    assert locality_ratio(shuffled) < 1.5


def test_labels_are_learnable_from_the_features(criteo_like):
    store = BatchStore(criteo_like)
    sparse, labels = store.sparse(), store.labels()
    half = len(labels) // 2
    score = np.zeros(len(labels) - half)
    for t in range(store.n_tables):  # naive-Bayes-like target encoding fitted on the first half
        hits = np.bincount(sparse[:half, t], weights=labels[:half], minlength=store.cardinalities[t])
        seen = np.bincount(sparse[:half, t], minlength=store.cardinalities[t])
        rate = (hits + labels[:half].mean()) / (seen + 1)
        score += np.log(rate[sparse[half:, t]] / (1 - rate[sparse[half:, t]]))
    assert roc_auc_score(labels[half:], score) > 0.65
