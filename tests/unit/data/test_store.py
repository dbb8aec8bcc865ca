"""The store: exact round trip, atomic writes, batches in file order, checksums."""
import json

import numpy as np
import pytest

from hybrid.data.store import BatchStore, StoreError, StoreWriter


def _write(path, n=100, tables=("a", "b"), n_dense=2, force=False, chunk=30):
    rng = np.random.default_rng(0)
    sparse = rng.integers(0, 10, size=(n, len(tables))).astype(np.int32)
    dense = rng.random((n, n_dense)).astype(np.float32)
    labels = (rng.random(n) < 0.3).astype(np.float32)
    with StoreWriter(path, n_samples=n, table_names=tables, n_dense=n_dense, source={"kind": "test"},
                     force=force) as writer:
        for start in range(0, n, chunk):
            writer.append(sparse[start:start + chunk], dense[start:start + chunk], labels[start:start + chunk])
        meta = writer.commit([10] * len(tables))
    return sparse, dense, labels, meta


def test_round_trip_in_file_order(tmp_path):
    sparse, dense, labels, meta = _write(tmp_path / "s")
    store = BatchStore(tmp_path / "s")
    assert store.n_samples == 100 and store.n_tables == 2 and store.n_dense == 2
    assert store.fingerprint == meta["fingerprint"]
    batches = list(store.batches(32))
    assert [b.index for b in batches] == [0, 1, 2]  # drop_last
    got = np.concatenate([b.sparse for b in batches])
    assert np.array_equal(got, sparse[:96])
    assert np.array_equal(np.concatenate([b.dense for b in batches]), dense[:96])
    assert np.array_equal(np.concatenate([b.labels for b in batches]), labels[:96])
    assert np.array_equal(np.concatenate([b.sample_ids for b in batches]), np.arange(96))
    assert len(list(store.batches(32, drop_last=False))) == 4
    assert [b.index for b in store.batches(32, start_batch=2)] == [2]


def test_shuffle_is_seeded_permutation(tmp_path):
    _write(tmp_path / "s")
    store = BatchStore(tmp_path / "s")
    a = np.concatenate([b.sample_ids for b in store.batches(10, shuffle=True, seed=3)])
    b = np.concatenate([b.sample_ids for b in store.batches(10, shuffle=True, seed=3)])
    c = np.concatenate([b.sample_ids for b in store.batches(10, shuffle=True, seed=4)])
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert sorted(a) == list(range(100)) and not np.array_equal(a, np.arange(100))


def test_epochs_follow_one_another_each_a_fresh_permutation_that_any_start_reproduces(tmp_path):
    _write(tmp_path / "s")
    store = BatchStore(tmp_path / "s")
    run = list(store.batches(30, shuffle=True, seed=3, stop_batch=9))  # 3 epochs of 3 batches (10 samples dropped)
    assert [b.index for b in run] == list(range(9))
    epochs = [np.concatenate([b.sample_ids for b in run[e * 3:e * 3 + 3]]) for e in range(3)]
    assert all(len(np.unique(e)) == 90 for e in epochs)  # within an epoch, no sample twice
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
    assert np.array_equal(epochs[0], np.concatenate([b.sample_ids for b in store.batches(30, shuffle=True, seed=3)]))
    resumed = list(store.batches(30, shuffle=True, seed=3, start_batch=4, stop_batch=9))  # mid-epoch 2
    assert all(np.array_equal(a.sample_ids, b.sample_ids) for a, b in zip(resumed, run[4:]))
    in_order = [b.sample_ids[0] for b in store.batches(30, stop_batch=6)]
    assert in_order == [0, 30, 60] * 2  # time order every epoch
    with pytest.raises(ValueError, match="drop_last"):
        list(store.batches(30, drop_last=False, stop_batch=9))


def test_validation_split_sits_between_train_and_test(tmp_path):
    sparse, *_ = _write(tmp_path / "s")
    views = {split: BatchStore(tmp_path / "s", split=split, test_fraction=0.2, validation_fraction=0.1)
             for split in ("train", "validation", "test")}
    assert [(v.start, v.stop) for v in views.values()] == [(0, 70), (70, 80), (80, 100)]
    assert np.array_equal(views["validation"].sparse(), sparse[70:80])
    with pytest.raises(ValueError, match="leave samples to train on"):
        BatchStore(tmp_path / "s", split="train", test_fraction=0.5, validation_fraction=0.5)


def test_train_test_split_is_leading_and_trailing(tmp_path):
    sparse, *_ = _write(tmp_path / "s")
    train = BatchStore(tmp_path / "s", split="train", test_fraction=0.2)
    test = BatchStore(tmp_path / "s", split="test", test_fraction=0.2)
    assert (train.n_samples, test.n_samples) == (80, 20)
    assert np.array_equal(test.sparse(), sparse[80:])
    assert next(test.batches(20)).sample_ids[0] == 80


def test_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with StoreWriter(tmp_path / "s", n_samples=10, table_names=["a"], n_dense=0, source={}) as writer:
            writer.append(np.zeros((5, 1), np.int32), np.zeros((5, 0), np.float32), np.zeros(5, np.float32))
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_incomplete_or_bad_ids_refuse_to_commit(tmp_path):
    with pytest.raises(StoreError, match="incomplete"):
        with StoreWriter(tmp_path / "s", n_samples=10, table_names=["a"], n_dense=0, source={}) as writer:
            writer.append(np.zeros((5, 1), np.int32), np.zeros((5, 0), np.float32), np.zeros(5, np.float32))
            writer.commit([1])
    with pytest.raises(StoreError, match=r"table a: ids span \[0, 7\], outside \[0, 5\)"):
        with StoreWriter(tmp_path / "s", n_samples=2, table_names=["a"], n_dense=0, source={}) as writer:
            writer.append(np.array([[0], [7]], np.int32), np.zeros((2, 0), np.float32), np.zeros(2, np.float32))
            writer.commit([5])
    assert list(tmp_path.iterdir()) == []


def test_wrong_chunk_shape_is_explained(tmp_path):
    with pytest.raises(ValueError, match=r"dense chunk: expected shape \(3, 2\), got \(3, 1\)"):
        with StoreWriter(tmp_path / "s", n_samples=3, table_names=["a"], n_dense=2, source={}) as writer:
            writer.append(np.zeros((3, 1), np.int32), np.zeros((3, 1), np.float32), np.zeros(3, np.float32))


def test_existing_store_needs_force(tmp_path):
    _write(tmp_path / "s")
    with pytest.raises(StoreError, match="--force"):
        _write(tmp_path / "s")
    *_, meta = _write(tmp_path / "s", n=50, force=True)
    assert BatchStore(tmp_path / "s").n_samples == 50
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_fingerprint_tracks_content_and_verify_detects_corruption(tmp_path):
    *_, meta_a = _write(tmp_path / "a", n=100)
    *_, meta_b = _write(tmp_path / "b", n=100, chunk=7)
    *_, meta_c = _write(tmp_path / "c", n=99)
    assert meta_a["fingerprint"] == meta_b["fingerprint"]  # chunking does not matter
    assert meta_a["fingerprint"] != meta_c["fingerprint"]
    BatchStore(tmp_path / "a").verify()
    labels = np.load(tmp_path / "a" / "labels.npy", mmap_mode="r+")
    labels[5] = 1 - labels[5]
    labels.flush()
    with pytest.raises(StoreError, match="labels.npy does not match"):
        BatchStore(tmp_path / "a").verify()


def test_reader_rejects_non_stores_and_other_versions(tmp_path):
    with pytest.raises(StoreError, match="not a store"):
        BatchStore(tmp_path)
    _write(tmp_path / "s")
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    meta["format_version"] = 999
    (tmp_path / "s" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(StoreError, match="rebuild"):
        BatchStore(tmp_path / "s")


def test_table_offsets_lay_tables_back_to_back(tmp_path):
    with StoreWriter(tmp_path / "s", n_samples=1, table_names=["a", "b", "c"], n_dense=0, source={}) as writer:
        writer.append(np.zeros((1, 3), np.int32), np.zeros((1, 0), np.float32), np.zeros(1, np.float32))
        writer.commit([4, 6, 1])
    assert list(BatchStore(tmp_path / "s").table_offsets) == [0, 4, 10]


def test_a_changed_meta_json_is_refused_naming_it(tmp_path):
    _write(tmp_path / "s")
    path = tmp_path / "s" / "meta.json"
    meta = json.loads(path.read_text())
    meta["cardinalities"][-1] = 5  # smaller than its ids: would read past the table
    path.write_text(json.dumps(meta))
    with pytest.raises(StoreError, match=r"meta.json was changed after the store was written"):
        BatchStore(tmp_path / "s")
    path.write_text("{not json")
    with pytest.raises(StoreError, match=r"meta.json: not readable JSON"):
        BatchStore(tmp_path / "s")


@pytest.mark.parametrize("name", ["sparse", "dense", "labels"])
def test_a_truncated_array_is_refused_naming_the_file(tmp_path, name):
    _write(tmp_path / "s")
    path = tmp_path / "s" / f"{name}.npy"
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(StoreError, match=rf"{name}.npy: cannot be read .* missing or truncated"):
        BatchStore(tmp_path / "s")


def test_an_array_of_another_shape_is_refused_naming_the_file(tmp_path):
    _write(tmp_path / "s")
    np.save(tmp_path / "s" / "dense.npy", np.zeros((100, 3), np.float32))
    with pytest.raises(StoreError, match=r"dense.npy: float32 \[100, 3\], but meta.json says float32 \[100, 2\]"):
        BatchStore(tmp_path / "s")


def test_ids_past_their_table_are_found_before_training(tmp_path):
    """A store whose meta.json was rewritten consistently (fingerprint included) but whose ids do not fit."""
    from hybrid.data.store import _fingerprint

    _write(tmp_path / "s")
    BatchStore(tmp_path / "s").check_ids()
    path = tmp_path / "s" / "meta.json"
    meta = json.loads(path.read_text())
    meta["cardinalities"] = [10, 4]
    meta["fingerprint"] = _fingerprint(meta)
    path.write_text(json.dumps(meta))
    store = BatchStore(tmp_path / "s")
    with pytest.raises(StoreError, match=r"sparse.npy: sample \d+ has id \d in table b, outside \[0, 4\)"):
        store.check_ids(chunk_rows=7)
