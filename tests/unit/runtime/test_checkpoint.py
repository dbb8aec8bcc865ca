"""Checkpoint files: atomic commit, pruning, streamed rows, damage and mismatch found before use."""
import json

import numpy as np
import pytest

from hybrid.config import load_config
from hybrid.runtime import checkpoint as ckpt


def _commit(directory: ckpt.CheckpointDir, step: int, rows: np.ndarray, run: str = "") -> ckpt.Checkpoint:
    staging = directory.staging(step)
    files = {"ps-0.npy": ckpt.write_rows(staging / "ps-0.npy", rows),
             "scheduler.npz": ckpt.write_arrays(staging / "scheduler.npz", {"next_alloc": np.arange(4)})}
    return directory.commit(staging, ckpt.metadata(step=step, training={"seed": 0}, fingerprint="f", files=files,
                                                   extra={"run": run} if run else {}))


def test_retention_removes_only_the_checkpoints_of_its_own_run(tmp_path):
    """Another run's checkpoints in the directory (one that ended, or older ones) are never pruned."""
    directory = ckpt.CheckpointDir(tmp_path, keep=2)
    rows = np.zeros((4, 3))
    for step in (100, 200, 300):
        _commit(directory, step, rows, run="aaaaaaaaaaaa")
    for step in (9, 19, 29):
        _commit(directory, step, rows, run="bbbbbbbbbbbb")
    assert [(c.step, c.meta["run"]) for c in directory.complete()] == \
        [(300, "aaaaaaaaaaaa"), (200, "aaaaaaaaaaaa"), (29, "bbbbbbbbbbbb"), (19, "bbbbbbbbbbbb")]


def test_commit_is_atomic_keeps_the_newest_and_ignores_unfinished_ones(tmp_path):
    directory = ckpt.CheckpointDir(tmp_path, keep=2)
    rows = np.arange(12, dtype=np.float64).reshape(4, 3)
    for step in (9, 19, 29):
        _commit(directory, step, rows + step)
    directory.staging(39)  # a crash while writing step 39: only a temporary directory
    (tmp_path / "step-000000049").mkdir()  # a directory without meta.json is not a checkpoint
    assert [c.step for c in directory.complete()] == [29, 19]
    assert not (tmp_path / "step-000000009").exists()
    assert (tmp_path / ".tmp-step-000000039").exists()
    newest = directory.complete()[0]
    assert ckpt.verify(newest, ["ps-0.npy", "scheduler.npz"]) is None
    out = np.empty_like(rows)
    ckpt.read_rows_into(newest.file("ps-0.npy"), out)
    assert np.array_equal(out, rows + 29)


def test_a_new_attempt_clears_failed_ones_and_saving_a_step_again_replaces_it_whole(tmp_path):
    directory = ckpt.CheckpointDir(tmp_path, keep=2)
    directory.staging(39)  # a crash while writing step 39
    _commit(directory, 49, np.zeros((2, 3)))
    assert not (tmp_path / ".tmp-step-000000039").exists()  # its space is given back
    _commit(directory, 49, np.ones((2, 3)))  # a resumed run that stops at once saves its step again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000049"]
    out = np.empty((2, 3))
    ckpt.read_rows_into(directory.complete()[0].file("ps-0.npy"), out)
    assert np.array_equal(out, np.ones((2, 3)))


def test_a_failed_write_removes_its_partial_file_and_says_the_old_checkpoints_are_intact(tmp_path):
    path = tmp_path / "ps-0.npy"
    with pytest.raises(ckpt.CheckpointError, match=r"cannot write .*ps-0.npy: No space left on device; the "
                                                   r"previous checkpoints are intact"):
        with ckpt.writing(path):
            path.write_bytes(b"partial")
            raise OSError(28, "No space left on device")
    assert not path.exists()


def test_room_is_checked_without_creating_anything(tmp_path):
    assert ckpt.room_problem(tmp_path / "a" / "b", need_bytes=1) is None
    assert not (tmp_path / "a").exists()
    assert "has" in ckpt.room_problem(tmp_path / "a", need_bytes=2**62) and "MB free" in \
        ckpt.room_problem(tmp_path, need_bytes=2**62)
    (tmp_path / "file").write_text("")
    assert ckpt.room_problem(tmp_path / "file" / "ck", need_bytes=0) == f"{tmp_path / 'file'} is not a directory"


def test_rows_are_written_and_read_in_chunks_equal_to_numpy_save(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt, "CHUNK_BYTES", 100)  # many chunks, and a last short one
    rows = np.random.default_rng(0).standard_normal((37, 5)).astype(np.float32)
    record = ckpt.write_rows(tmp_path / "rows.npy", rows)
    assert np.array_equal(np.load(tmp_path / "rows.npy"), rows)
    assert record == ckpt.file_record(tmp_path / "rows.npy")
    out = np.zeros_like(rows)
    ckpt.read_rows_into(tmp_path / "rows.npy", out)
    assert np.array_equal(out, rows)
    with pytest.raises(ckpt.CheckpointError, match=r"holds \(37, 5\) float32, expected \(37, 6\)"):
        ckpt.read_rows_into(tmp_path / "rows.npy", np.zeros((37, 6), np.float32))


@pytest.mark.parametrize("damage, reason", [
    ("truncate", "ps-0.npy has 200 bytes, 224 were written (truncated or replaced)"),
    ("flip", "ps-0.npy does not match its SHA-256 (corrupted)"),
    ("delete", "ps-0.npy is missing"),
])
def test_a_damaged_file_is_named_with_what_is_wrong(tmp_path, damage, reason):
    checkpoint = _commit(ckpt.CheckpointDir(tmp_path), 9, np.ones((4, 3)))
    path = checkpoint.file("ps-0.npy")
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(data[:200])
    elif damage == "flip":
        data[-1] ^= 0xFF
        path.write_bytes(data)
    else:
        path.unlink()
    assert ckpt.verify(checkpoint, ["ps-0.npy"]) == reason
    assert ckpt.verify(checkpoint, ["scheduler.npz"]) is None
    assert ckpt.verify(checkpoint, ["dense.pt"]) == "dense.pt is not listed in its meta.json"


def test_arrays_that_would_need_unpickling_are_refused(tmp_path):
    np.savez(tmp_path / "evil.npz", payload=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match="allow_pickle"):
        ckpt.read_arrays(tmp_path / "evil.npz")


def test_a_checkpoint_of_another_config_or_data_names_what_differs(tmp_path):
    config = load_config(None, ["train.embedding_lr=0.5"])
    checkpoint = ckpt.Checkpoint(tmp_path, ckpt.metadata(step=3, training=config.training_dict(), fingerprint="abc",
                                                         files={}, extra={}))
    assert ckpt.mismatch(checkpoint, config.training_dict(), "abc") is None
    changed = load_config(None, ["train.embedding_lr=0.25", "train.checkpoint_every=5", "train.watchdog_seconds=9"])
    assert ckpt.mismatch(checkpoint, changed.training_dict(), "abc") == \
        "it was written by another config: train.embedding_lr (checkpoint 0.5, now 0.25)"
    assert "fingerprint abc, this store has xyz" in ckpt.mismatch(checkpoint, config.training_dict(), "xyz")
    json.dumps(checkpoint.meta)  # meta.json is plain JSON
    older = ckpt.Checkpoint(tmp_path, {**checkpoint.meta, "config": {k: {kk: vv for kk, vv in v.items()
                                                                         if kk != "embedding_optimizer"}
                                                                     if isinstance(v, dict) else v
                                                                     for k, v in checkpoint.meta["config"].items()}})
    assert ckpt.mismatch(older, config.training_dict(), "abc") is None, "a key it predates counts as its default"


def test_a_checkpoint_resumes_on_another_cluster_shape_and_length_only_with_its_global_batch(tmp_path):
    config = load_config(None, ["cluster.workers=4", "cluster.ps=2", "train.batch_per_worker=8",
                                "train.iterations=10"])
    checkpoint = ckpt.Checkpoint(tmp_path, ckpt.metadata(step=9, training=config.training_dict(), fingerprint="abc",
                                                         files={}, extra={}))
    for shape in (["cluster.workers=2", "cluster.ps=1", "train.batch_per_worker=16", "cache.ratio=0.3"],
                  ["cluster.workers=8", "cluster.ps=3", "train.batch_per_worker=4", "train.iterations=40"]):
        assert ckpt.mismatch(checkpoint, load_config(None, shape).training_dict(), "abc") is None, shape
    kept = load_config(None, ["cluster.workers=2", "cluster.ps=1", "train.batch_per_worker=8"])
    assert ckpt.mismatch(checkpoint, kept.training_dict(), "abc") == (
        "its global batch is 32 samples (4 workers x 8), this run's 16: train.batch_per_worker=16 keeps it "
        "on 2 workers")
    odd = load_config(None, ["cluster.workers=3", "cluster.ps=1", "train.batch_per_worker=8"])
    assert "no train.batch_per_worker keeps it on 3 workers" in ckpt.mismatch(checkpoint, odd.training_dict(), "abc")


def test_reading_rows_stops_at_a_truncated_file(tmp_path):
    rows = np.arange(40, dtype=np.float32).reshape(10, 4)
    ckpt.write_rows(tmp_path / "rows.npy", rows)
    data = (tmp_path / "rows.npy").read_bytes()
    (tmp_path / "rows.npy").write_bytes(data[:-8])
    with pytest.raises(ckpt.CheckpointError, match="ends early"):
        ckpt.read_rows_into(tmp_path / "rows.npy", np.zeros_like(rows))
    (tmp_path / "rows.npy").write_bytes(b"not an array")
    with pytest.raises(ckpt.CheckpointError, match="not a .npy file"):
        ckpt.read_rows_into(tmp_path / "rows.npy", np.zeros_like(rows))
