"""The binary sample store: memory-mapped arrays every rank reads the same way.

Layout of a store directory (docs/design.md section 10)::

    meta.json      counts, table names, cardinalities, source, fingerprint
    sparse.npy     int32 [n_samples, n_tables]   per-table row ids
    dense.npy      float32 [n_samples, n_dense]  (log-transformed features)
    labels.npy     float32 [n_samples]
    vocab/         per-table value lists (only for preprocessed real data)

Stores are written into a temporary sibling directory and renamed into place
when complete, so a failed or interrupted run never leaves a partial store.
The fingerprint (counts, cardinalities and a checksum of the arrays) lets
ranks verify at start-up that they read the same data.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from hybrid.counter_hash import hash3, stream_id

FORMAT_VERSION = 1
_ARRAYS = ("sparse", "dense", "labels")


class StoreError(RuntimeError):
    """A store is missing, incomplete or inconsistent."""


@dataclass(frozen=True)
class GlobalBatch:
    """One global batch: every worker sees it; the scheduler splits it."""

    index: int
    sparse: np.ndarray  # int32 [B, n_tables]
    dense: np.ndarray  # float32 [B, n_dense]
    labels: np.ndarray  # float32 [B]
    sample_ids: np.ndarray  # int64 [B], positions in the store

    def __len__(self) -> int:
        return len(self.labels)


class StoreWriter:
    """Writes a store of known size chunk by chunk.

    Use it as a context manager: ``commit()`` publishes the store; leaving the
    block without committing (an error, an interrupt) deletes everything.

    The row count must be known up front (preprocessing counts it in its first
    pass) so the arrays can be preallocated as memory maps on disk.
    """

    def __init__(self, out_dir: str | Path, *, n_samples: int, table_names: Sequence[str],
                 n_dense: int, source: dict, force: bool = False):
        self.out_dir = Path(out_dir)
        if self.out_dir.exists() and not force:
            raise StoreError(f"{self.out_dir} already exists; pass --force to replace it")
        if n_samples < 1:
            raise StoreError(f"a store needs at least one sample, got {n_samples}")
        self.n_samples = n_samples
        self.table_names = list(table_names)
        self.n_dense = n_dense
        self.source = source
        self.force = force
        self.tmp_dir = self.out_dir.with_name(f".{self.out_dir.name}.tmp-{os.getpid()}")
        self._filled = 0
        self._hashers = {name: hashlib.blake2b(digest_size=16) for name in _ARRAYS}

    def __enter__(self) -> "StoreWriter":
        if self.tmp_dir.exists():
            shutil.rmtree(self.tmp_dir)
        self.tmp_dir.mkdir(parents=True)
        open_memmap = np.lib.format.open_memmap
        n, t = self.n_samples, len(self.table_names)
        self.sparse = open_memmap(self.tmp_dir / "sparse.npy", "w+", np.int32, (n, t))
        self.dense = open_memmap(self.tmp_dir / "dense.npy", "w+", np.float32, (n, self.n_dense))
        self.labels = open_memmap(self.tmp_dir / "labels.npy", "w+", np.float32, (n,))
        return self

    @property
    def vocab_dir(self) -> Path:
        path = self.tmp_dir / "vocab"
        path.mkdir(exist_ok=True)
        return path

    def append(self, sparse: np.ndarray, dense: np.ndarray, labels: np.ndarray) -> None:
        """Append the next chunk of samples (in order)."""
        k = len(labels)
        expected = {"sparse": (k, len(self.table_names)), "dense": (k, self.n_dense), "labels": (k,)}
        for name, array in zip(_ARRAYS, (sparse, dense, labels)):
            if array.shape != expected[name]:
                raise ValueError(f"{name} chunk: expected shape {expected[name]}, got {array.shape}")
        if self._filled + k > self.n_samples:
            raise StoreError(f"more samples than announced ({self.n_samples})")
        rows = slice(self._filled, self._filled + k)
        self.sparse[rows] = sparse
        self.dense[rows] = dense
        self.labels[rows] = labels
        for name in _ARRAYS:
            self._hashers[name].update(np.ascontiguousarray(getattr(self, name)[rows]).tobytes())
        self._filled += k

    def commit(self, cardinalities: Sequence[int]) -> dict:
        """Check completeness, write meta.json and move the store into place."""
        if self._filled != self.n_samples:
            raise StoreError(f"store incomplete: {self._filled} of {self.n_samples} samples written")
        cardinalities = [int(c) for c in cardinalities]
        if len(cardinalities) != len(self.table_names):
            raise ValueError(f"expected {len(self.table_names)} cardinalities, got {len(cardinalities)}")
        self._check_ids(cardinalities)
        for name in _ARRAYS:
            getattr(self, name).flush()
        meta = {
            "format_version": FORMAT_VERSION,
            "n_samples": self.n_samples,
            "n_dense": self.n_dense,
            "table_names": self.table_names,
            "cardinalities": cardinalities,
            "source": self.source,
            "checksums": {name: self._hashers[name].hexdigest() for name in _ARRAYS},
        }
        meta["fingerprint"] = _fingerprint(meta)
        (self.tmp_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        del self.sparse, self.dense, self.labels
        if self.out_dir.exists():
            old = self.out_dir.with_name(f".{self.out_dir.name}.old-{os.getpid()}")
            self.out_dir.rename(old)
            self.tmp_dir.rename(self.out_dir)
            shutil.rmtree(old)
        else:
            self.tmp_dir.rename(self.out_dir)
        return meta

    def _check_ids(self, cardinalities: Sequence[int]) -> None:
        """Every id must index its table: a bad id would crash a PS much later."""
        if not self.table_names:
            return
        lowest, highest = self.sparse.min(axis=0), self.sparse.max(axis=0)
        for name, low, high, card in zip(self.table_names, lowest, highest, cardinalities):
            if low < 0 or high >= card:
                raise StoreError(f"table {name}: ids span [{low}, {high}], outside [0, {card})")

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or self.tmp_dir.exists():
            for name in _ARRAYS:
                self.__dict__.pop(name, None)
            shutil.rmtree(self.tmp_dir, ignore_errors=True)


def _fingerprint(meta: dict) -> str:
    keys = ("format_version", "n_samples", "n_dense", "table_names", "cardinalities", "checksums")
    text = json.dumps({k: meta[k] for k in keys}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class BatchStore:
    """Read-only view of a store, serving global batches.

    Batches come **in file order** by default: real datasets are chronological
    and online training sees them in time order, which is the temporal
    locality Herald exploits. ``shuffle=True`` gives a seeded, rank-independent
    permutation instead. ``split`` selects the leading ``1 - test_fraction``
    (train) or the trailing ``test_fraction`` (test) of the samples.
    """

    def __init__(self, path: str | Path, *, split: str = "all", test_fraction: float = 0.0):
        self.path = Path(path)
        meta_path = self.path / "meta.json"
        if not meta_path.is_file():
            raise StoreError(f"{self.path} is not a store (no meta.json); create one with "
                             "'hybrid synth' or 'hybrid preprocess'")
        self.meta = json.loads(meta_path.read_text())
        if self.meta.get("format_version") != FORMAT_VERSION:
            raise StoreError(f"{self.path}: store format {self.meta.get('format_version')}, "
                             f"this version reads {FORMAT_VERSION}; rebuild the store")
        arrays = {name: np.load(self.path / f"{name}.npy", mmap_mode="r") for name in _ARRAYS}
        self._sparse, self._dense, self._labels = arrays["sparse"], arrays["dense"], arrays["labels"]
        n = self.meta["n_samples"]
        if self._sparse.shape != (n, len(self.meta["table_names"])) or len(self._labels) != n:
            raise StoreError(f"{self.path}: arrays do not match meta.json (n_samples={n})")
        if split not in ("all", "train", "test"):
            raise ValueError(f"split must be 'all', 'train' or 'test', got {split!r}")
        if not 0.0 <= test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
        n_test = int(round(n * test_fraction))
        bounds = {"all": (0, n), "train": (0, n - n_test), "test": (n - n_test, n)}[split]
        self.split = split
        self.start, self.stop = bounds

    @property
    def n_samples(self) -> int:
        return self.stop - self.start

    @property
    def n_tables(self) -> int:
        return len(self.meta["table_names"])

    @property
    def n_dense(self) -> int:
        return self.meta["n_dense"]

    @property
    def table_names(self) -> list[str]:
        return list(self.meta["table_names"])

    @property
    def cardinalities(self) -> np.ndarray:
        return np.asarray(self.meta["cardinalities"], dtype=np.int64)

    @property
    def table_offsets(self) -> np.ndarray:
        """Global row id of each table's row 0 (tables laid out back to back)."""
        return np.concatenate([[0], np.cumsum(self.cardinalities)[:-1]]).astype(np.int64)

    @property
    def fingerprint(self) -> str:
        return self.meta["fingerprint"]

    def sparse(self) -> np.ndarray:
        """All row ids of this split, [n_samples, n_tables] (memory-mapped)."""
        return self._sparse[self.start:self.stop]

    def labels(self) -> np.ndarray:
        return self._labels[self.start:self.stop]

    def num_batches(self, batch_size: int, drop_last: bool = True) -> int:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        full, rest = divmod(self.n_samples, batch_size)
        return full + (0 if drop_last or rest == 0 else 1)

    def order(self, shuffle: bool = False, seed: int = 0) -> np.ndarray:
        """Sample positions in serving order (file order unless shuffled)."""
        positions = np.arange(self.start, self.stop, dtype=np.int64)
        if not shuffle:
            return positions
        keys = hash3(seed, stream_id("shuffle"), positions)
        return positions[np.argsort(keys, kind="stable")]

    def batches(self, batch_size: int, *, shuffle: bool = False, seed: int = 0,
                drop_last: bool = True, start_batch: int = 0) -> Iterator[GlobalBatch]:
        """Global batches in order, from ``start_batch`` (for resuming)."""
        order = self.order(shuffle, seed)
        for index in range(start_batch, self.num_batches(batch_size, drop_last)):
            ids = order[index * batch_size:(index + 1) * batch_size]
            yield self.gather(index, ids)

    def gather(self, index: int, sample_ids: np.ndarray) -> GlobalBatch:
        """Materialize the samples at ``sample_ids`` as a batch."""
        contiguous = len(sample_ids) > 0 and sample_ids[-1] - sample_ids[0] == len(sample_ids) - 1 \
            and bool(np.all(np.diff(sample_ids) == 1))
        take = slice(int(sample_ids[0]), int(sample_ids[-1]) + 1) if contiguous else sample_ids
        return GlobalBatch(
            index=index,
            sparse=np.array(self._sparse[take]),
            dense=np.array(self._dense[take]),
            labels=np.array(self._labels[take]),
            sample_ids=np.asarray(sample_ids, dtype=np.int64),
        )

    def verify(self) -> None:
        """Recompute the checksums; raise if the arrays changed since writing."""
        for name in _ARRAYS:
            array = {"sparse": self._sparse, "dense": self._dense, "labels": self._labels}[name]
            hasher = hashlib.blake2b(digest_size=16)
            step = max(1, (64 << 20) // max(1, array[:1].nbytes))
            for begin in range(0, len(array), step):
                hasher.update(np.ascontiguousarray(array[begin:begin + step]).tobytes())
            if hasher.hexdigest() != self.meta["checksums"][name]:
                raise StoreError(f"{self.path}/{name}.npy does not match its checksum; the store is corrupt")
