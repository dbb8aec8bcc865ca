"""Synthetic data: seeded, chunk-independent, and with the structure it documents."""
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from hybrid._ext.session_process import SessionProcess
from hybrid.config import ConfigError, Mode, load_config
from hybrid.data.access_stats import batch_recurrence, cooccurrence_ratio, locality_ratio, store_stats, top_share
from hybrid.data.calibration import table_statistics
from hybrid.data.store import BatchStore
from hybrid.data.synthetic import CRITEO_KAGGLE, MOVIELENS_100K, PROFILES, SyntheticGenerator, synthesize, zipf_cdf
from hybrid.training.simulator import reduction, simulate_mode

REPO = Path(__file__).resolve().parents[3]
REAL_ML100K = REPO / "data" / "ml-100k"

# Measured on the real MovieLens-100k (data/ml-100k from `hybrid fetch movielens-100k`, fingerprint
# 6e5cc63a732b2dac21048b07d976a6fd) with `python -m hybrid.data.calibration data/ml-100k DIR`
# (global batch 1024, all 100,000 samples in time order); shares as fractions.
REAL_ML100K_STATS = {
    "user_id": {"reuse p50": 1, "reuse p90": 1, "reuse <= 1 batch": 0.989, "reuse <= 2 batch": 0.991,
                "reuse <= 4 batch": 0.994, "reuse <= 8 batch": 0.996, "in same batch": 0.976,
                "in next 1 batch": 0.208, "in next 2 batch": 0.289, "in next 4 batch": 0.388},
    "item_id": {"reuse p10": 99, "reuse p25": 219, "reuse p50": 496, "reuse p75": 1162, "reuse p90": 2729,
                "reuse <= 1 batch": 0.719, "reuse <= 2 batch": 0.863, "reuse <= 4 batch": 0.939,
                "reuse <= 8 batch": 0.977, "in same batch": 0.448, "in next 1 batch": 0.631,
                "in next 2 batch": 0.788, "in next 4 batch": 0.893},
}
# Herald's cut of vanilla's transmissions on the real data: `hybrid simulate --config configs/ml100k.yaml
# --workers 8 --modes vanilla,herald` -> -total 51.6%; with data.shuffle=true -> 25.5%.
REAL_ML100K_HERALD_CUT = {False: 0.516, True: 0.255}


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


def test_session_process_options_keep_chunking_and_default_stream():
    cdf = zipf_cdf(300, 0.5)
    options = dict(seed=5, n_active=4, mean_length=20, context_cdf=cdf, stickiness=0.8, revisit=0.5, recent=16)
    whole, counts = SessionProcess(**options).take_counted(2000)
    parts = SessionProcess(**options)
    pieces = [parts.take_counted(n) for n in (7, 993, 1000)]
    assert np.array_equal(whole, np.concatenate([p[0] for p in pieces]))
    assert np.array_equal(counts, np.concatenate([p[1] for p in pieces]))
    assert all((counts[whole == c] == np.arange((whole == c).sum())).all() for c in np.unique(whole))
    plain = SessionProcess(seed=5, n_active=4, mean_length=20, context_cdf=cdf)
    zeroed = SessionProcess(seed=5, n_active=4, mean_length=20, context_cdf=cdf, stickiness=0.0, revisit=0.0)
    assert np.array_equal(plain.take(2000), zeroed.take(2000))  # the options off leave the stream as it was
    runs = np.count_nonzero(np.diff(whole) != 0)
    assert runs < np.count_nonzero(np.diff(plain.take(2000)) != 0) / 2  # stickiness makes runs


def test_batch_recurrence_counts_repeats_and_returns():
    ids = np.array([1, 1, 2, 3,   4, 5, 6, 7,   1, 8, 9, 9,   2, 10, 11, 12])
    r = batch_recurrence(ids, 4, lookahead=(1, 2))
    assert r["same"] == pytest.approx((1 / 4 + 0 + 1 / 4 + 0) / 4)
    assert r[1] == pytest.approx((0 + 0 + 0) / 3)  # batch 0's rows {1,2,3}: none in batch 1
    assert r[2] == pytest.approx((1 / 3 + 0) / 2)  # row 1 returns two batches later


@pytest.fixture(scope="module")
def ml100k_like(tmp_path_factory):
    """The calibrated MovieLens-100k-like store at the real data's size (configs/ml100k-synthetic.yaml)."""
    path = tmp_path_factory.mktemp("stores") / "ml100k-like"
    synthesize(path, like="movielens-100k", rows=100_000, scale=1.0, seed=0)
    return path


def test_movielens_100k_like_has_the_real_sizes_and_no_repeated_rating(ml100k_like):
    store = BatchStore(ml100k_like, test_fraction=0.0)
    assert list(store.cardinalities) == [943, 1682] and len(store.labels()) == 100_000
    sparse = store.sparse().astype(np.int64)
    assert np.unique(sparse[:, 0] * 1682 + sparse[:, 1]).size == len(sparse)  # a user rates an item once


def test_movielens_100k_like_is_chunk_independent():
    whole = SyntheticGenerator(MOVIELENS_100K, rows=5000, scale=1.0, seed=3).chunk(0, 5000)
    generator = SyntheticGenerator(MOVIELENS_100K, rows=5000, scale=1.0, seed=3)
    parts = [generator.chunk(start, size) for start, size in ((0, 123), (123, 2877), (3000, 2000))]
    for k in range(3):
        assert np.array_equal(whole[k], np.concatenate([p[k] for p in parts]))


@pytest.mark.parametrize("table", sorted(REAL_ML100K_STATS))
def test_movielens_100k_like_reproduces_the_real_recurrence(ml100k_like, table):
    column = BatchStore(ml100k_like, test_fraction=0.0).table_names.index(table)
    synthetic = table_statistics(BatchStore(ml100k_like, test_fraction=0.0).sparse()[:, column], 1024)
    for name, real in REAL_ML100K_STATS[table].items():
        if name.startswith("reuse p"):  # distances in samples: within 20% (and 2 samples)
            assert abs(synthetic[name] - real) <= max(2, 0.2 * real), (table, name, synthetic[name], real)
        else:  # shares: within 3 percentage points
            assert abs(synthetic[name] - real) <= 0.03, (table, name, synthetic[name], real)


@pytest.mark.parametrize("shuffle", [False, True])
def test_movielens_100k_like_gives_herald_the_real_cut(ml100k_like, shuffle):
    overrides = [f"data.path={ml100k_like}", "cluster.workers=8", f"data.shuffle={str(shuffle).lower()}"]
    store = BatchStore(ml100k_like, split="train", test_fraction=0.1)
    counts = {mode: simulate_mode(load_config(REPO / "configs/ml100k.yaml", overrides + [f"scheduler.mode={mode.value}"]),
                                  store, mode) for mode in (Mode.vanilla, Mode.herald)}
    cut = reduction(counts[Mode.herald], counts[Mode.vanilla])["transmissions"]
    assert abs(cut - REAL_ML100K_HERALD_CUT[shuffle]) <= 0.05


@pytest.mark.skipif(not (REAL_ML100K / "meta.json").is_file(), reason="data/ml-100k not fetched")
@pytest.mark.parametrize("table", sorted(REAL_ML100K_STATS))
def test_real_movielens_100k_constants_are_current(table):
    store = BatchStore(REAL_ML100K, test_fraction=0.0)
    measured = table_statistics(store.sparse()[:, store.table_names.index(table)], 1024)
    for name, value in REAL_ML100K_STATS[table].items():
        assert measured[name] == pytest.approx(value, abs=0.0006 if value < 1 else 0.5), (table, name)


def test_a_config_can_give_any_profile_the_calibrated_recurrence(tmp_path):
    plain = synthesize(tmp_path / "plain", like="criteo-kaggle", rows=3000, scale=0.0005)
    runs = synthesize(tmp_path / "runs", like="criteo-kaggle", rows=3000, scale=0.0005,
                      recurrence={"stickiness": 0.9, "revisit": 0.3, "recent": 128})
    assert runs["fingerprint"] != plain["fingerprint"] and runs["source"]["stickiness"] == 0.9
    sparse = BatchStore(tmp_path / "runs", test_fraction=0.0).sparse()
    repeats = (sparse[1:, 2] == sparse[:-1, 2]).mean()  # C3 follows the context: runs repeat it
    assert repeats > 2 * (BatchStore(tmp_path / "plain", test_fraction=0.0).sparse()[1:, 2] ==
                          BatchStore(tmp_path / "plain", test_fraction=0.0).sparse()[:-1, 2]).mean()
    with pytest.raises(ValueError, match="unknown settings"):
        synthesize(tmp_path / "bad", like="avazu", rows=10, scale=0.001, recurrence={"sticky": 0.5})
    config = load_config(REPO / "configs/w1-smoke.yaml", ["data.synthetic.stickiness=0.9"])
    assert config.data.synthetic.recurrence() == {"stickiness": 0.9}
    with pytest.raises(ConfigError, match="stickiness"):
        load_config(REPO / "configs/w1-smoke.yaml", ["data.synthetic.stickiness=1.5"])
