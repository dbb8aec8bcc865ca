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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

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
    strip: Optional[object] = None  # FAE: its hybrid.scheduling.fae_order.Strip

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
        try:
            if self.tmp_dir.exists():
                shutil.rmtree(self.tmp_dir)
            self.tmp_dir.mkdir(parents=True)
        except OSError as err:
            raise StoreError(f"cannot create the store {self.out_dir}: {err.strerror or err} "
                             f"({self.tmp_dir.parent}); choose a writable directory") from None
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

    def adopt_written(self) -> None:
        """Every row was written into the arrays' files by other processes: checksum them, each array on a
        thread of its own, while one more thread puts them on disk (reading, hashing and syncing release
        the GIL; :meth:`commit` then finds nothing left to write)."""
        def checksum(name: str) -> None:
            """Read, not mapped: a mapping would count every page read in this process's resident memory."""
            array = getattr(self, name)
            at, end = array.offset, array.offset + array.nbytes
            buffer = memoryview(bytearray(16 << 20))
            with open(self.tmp_dir / f"{name}.npy", "rb", buffering=0) as f:
                f.seek(at)
                while at < end:
                    got = f.readinto(buffer[:min(len(buffer), end - at)])
                    if not got:
                        raise StoreError(f"{self.tmp_dir / name}.npy is shorter than its {len(array)} rows")
                    self._hashers[name].update(buffer[:got])
                    at += got

        def sync() -> None:
            for name in _ARRAYS:
                fd = os.open(self.tmp_dir / f"{name}.npy", os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

        if self._filled:
            raise StoreError(f"{self._filled} rows were appended: a store is written by append or by others")
        with ThreadPoolExecutor(len(_ARRAYS) + 1) as threads:
            done = [threads.submit(checksum, name) for name in _ARRAYS] + [threads.submit(sync)]
            for future in done:
                future.result()
        self._filled = self.n_samples

    def commit(self, cardinalities: Sequence[int], id_range: Optional[tuple] = None) -> dict:
        """Check completeness, write meta.json and move the store into place.

        ``id_range``: each table's lowest and highest id, if the processes
        that wrote the rows found them (else they are read here).
        """
        if self._filled != self.n_samples:
            raise StoreError(f"store incomplete: {self._filled} of {self.n_samples} samples written")
        cardinalities = [int(c) for c in cardinalities]
        if len(cardinalities) != len(self.table_names):
            raise ValueError(f"expected {len(self.table_names)} cardinalities, got {len(cardinalities)}")
        self._check_ids(cardinalities, id_range)
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

    def _check_ids(self, cardinalities: Sequence[int], id_range: Optional[tuple]) -> None:
        """Every id must index its table: a bad id would crash a PS much later."""
        if not self.table_names:
            return
        lowest, highest = id_range if id_range is not None else (self.sparse.min(axis=0), self.sparse.max(axis=0))
        for name, low, high, card in zip(self.table_names, lowest, highest, cardinalities):
            if low < 0 or high >= card:
                raise StoreError(f"table {name}: ids span [{low}, {high}], outside [0, {card})")

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or self.tmp_dir.exists():
            for name in _ARRAYS:
                self.__dict__.pop(name, None)
            shutil.rmtree(self.tmp_dir, ignore_errors=True)


def _read_meta(path: Path) -> dict:
    """``meta.json``, checked: readable, this format, the keys it needs, and unchanged since it was written."""
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise StoreError(f"{path}: not readable JSON ({err}); rebuild the store") from err
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        found = meta.get("format_version") if isinstance(meta, dict) else None
        raise StoreError(f"{path}: store format {found}, this version reads {FORMAT_VERSION}; rebuild the store")
    try:
        intact = _fingerprint(meta) == meta["fingerprint"]
    except (KeyError, TypeError) as err:
        raise StoreError(f"{path}: missing or malformed key {err}; rebuild the store") from err
    if not intact:
        raise StoreError(f"{path} was changed after the store was written (its fingerprint does not match its "
                         f"contents); restore it or rebuild the store")
    return meta


def _expected_arrays(meta: dict) -> dict:
    n, tables = meta["n_samples"], len(meta["table_names"])
    return {"sparse": ((n, tables), np.int32), "dense": ((n, meta["n_dense"]), np.float32),
            "labels": ((n,), np.float32)}


def _open_array(path: Path, shape: tuple, dtype) -> np.ndarray:
    """Memory-map ``path``, refusing a missing, truncated or mis-shaped file by name."""
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as err:
        raise StoreError(f"{path}: cannot be read ({err}); the file is missing or truncated: rebuild the store") \
            from err
    if array.shape != shape or array.dtype != np.dtype(dtype):
        raise StoreError(f"{path}: {array.dtype} {list(array.shape)}, but meta.json says {np.dtype(dtype)} "
                         f"{list(shape)}; rebuild the store")
    return array


def _fingerprint(meta: dict) -> str:
    keys = ("format_version", "n_samples", "n_dense", "table_names", "cardinalities", "checksums")
    text = json.dumps({k: meta[k] for k in keys}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class BatchStore:
    """Read-only view of a store, serving global batches.

    Batches come **in file order** by default: real datasets are chronological
    and online training sees them in time order, which is the temporal
    locality Herald exploits. ``shuffle=True`` gives a seeded, rank-independent
    permutation instead, a fresh one each epoch. ``split`` selects, in time
    order, the leading samples (train), the ``validation_fraction`` after
    them (validation) or the trailing ``test_fraction`` (test).
    """

    def __init__(self, path: str | Path, *, split: str = "all", test_fraction: float = 0.0,
                 validation_fraction: float = 0.0):
        self.path = Path(path)
        meta_path = self.path / "meta.json"
        if not meta_path.is_file():
            raise StoreError(f"{self.path} is not a store (no meta.json); create one with "
                             "'hybrid synth' or 'hybrid preprocess'")
        self.meta = _read_meta(meta_path)
        arrays = {name: _open_array(self.path / f"{name}.npy", shape, dtype)
                  for name, (shape, dtype) in _expected_arrays(self.meta).items()}
        self._sparse, self._dense, self._labels = arrays["sparse"], arrays["dense"], arrays["labels"]
        # the same pages as plain arrays for the per-batch reads: slicing a np.memmap makes memmap objects
        # (8.5 us per W1 smoke batch in gather against 5.8), on every worker's scheduler thread, whose
        # interpreter-held time the training loop waits out (docs/benchmarks.md, issue 54)
        self._batch_columns = tuple(a.view(np.ndarray) for a in (self._sparse, self._dense, self._labels))
        n = self.meta["n_samples"]
        if split not in ("all", "train", "validation", "test"):
            raise ValueError(f"split must be 'all', 'train', 'validation' or 'test', got {split!r}")
        if not (0.0 <= test_fraction < 1.0 and 0.0 <= validation_fraction < 1.0
                and test_fraction + validation_fraction < 1.0):
            raise ValueError(f"test_fraction and validation_fraction must be in [0, 1) and leave samples to "
                             f"train on, got {test_fraction} and {validation_fraction}")
        n_test, n_validation = int(round(n * test_fraction)), int(round(n * validation_fraction))
        train_end = n - n_test - n_validation
        bounds = {"all": (0, n), "train": (0, train_end), "validation": (train_end, n - n_test),
                  "test": (n - n_test, n)}[split]
        self.split = split
        self.start, self.stop = bounds

    @classmethod
    def of(cls, data, split: str) -> "BatchStore":
        """``split`` of the store a config's ``data`` section (path, test and validation fractions) names."""
        return cls(data.path, split=split, test_fraction=data.test_fraction,
                   validation_fraction=data.validation_fraction)

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

    def order(self, shuffle: bool = False, seed: int = 0, epoch: int = 0) -> np.ndarray:
        """Sample positions in serving order in ``epoch``: file order, or shuffled afresh each epoch.

        The permutation is a function of (seed, epoch) alone, so every rank
        draws the same one without a message, and a run resumed in the middle
        of an epoch continues its order exactly (docs/design.md section 10).
        """
        positions = np.arange(self.start, self.stop, dtype=np.int64)
        if not shuffle:
            return positions
        stream = stream_id("shuffle") if epoch == 0 else stream_id("shuffle", epoch)  # epoch 0: as before epochs
        keys = hash3(seed, stream, positions)
        return positions[np.argsort(keys, kind="stable")]

    def batches(self, batch_size: int, *, shuffle: bool = False, seed: int = 0, drop_last: bool = True,
                start_batch: int = 0, stop_batch: Optional[int] = None) -> Iterator[GlobalBatch]:
        """Global batches ``start_batch .. stop_batch - 1`` (default: one pass), epoch after epoch.

        Batch ``b`` is batch ``b % per_epoch`` of epoch ``b // per_epoch``;
        a partial last batch (``drop_last=False``) exists in one pass only.
        """
        per_epoch = self.num_batches(batch_size, drop_last)
        if per_epoch == 0:
            return
        if stop_batch is None:
            stop_batch = per_epoch
        elif stop_batch > per_epoch and not drop_last:
            raise ValueError("batches past one pass drop the partial last batch: use drop_last=True")
        epoch, order = -1, None
        for index in range(start_batch, stop_batch):
            if index // per_epoch != epoch:
                epoch = index // per_epoch
                order = self.order(shuffle, seed, epoch)
            within = index % per_epoch
            yield self.gather(index, order[within * batch_size:(within + 1) * batch_size])

    def gather(self, index: int, sample_ids: np.ndarray) -> GlobalBatch:
        """Materialize the samples at ``sample_ids`` as a batch."""
        contiguous = len(sample_ids) > 0 and sample_ids[-1] - sample_ids[0] == len(sample_ids) - 1 \
            and bool(np.all(np.diff(sample_ids) == 1))
        take = slice(int(sample_ids[0]), int(sample_ids[-1]) + 1) if contiguous else sample_ids
        sparse, dense, labels = self._batch_columns
        return GlobalBatch(
            index=index,
            sparse=np.array(sparse[take]),
            dense=np.array(dense[take]),
            labels=np.array(labels[take]),
            sample_ids=np.asarray(sample_ids, dtype=np.int64),
        )

    def check_ids(self, chunk_rows: int = 1 << 16) -> None:
        """Raise unless every id of every table is in ``[0, cardinality)`` (reads ``sparse.npy`` once).

        Training calls it before any rank uses the data: an id past its table
        would make the scheduler's kernels (compiled without bounds checks)
        read out of bounds, or silently train the next table's rows. It reads
        the file in chunks rather than through the memory map, so the pages
        it reads do not stay in this rank's resident memory.
        """
        cardinalities = self.cardinalities
        n, tables = self._sparse.shape
        with open(self.path / "sparse.npy", "rb") as f:
            for begin in range(0, n, chunk_rows):
                f.seek(self._sparse.offset + begin * tables * 4)
                chunk = np.fromfile(f, dtype=np.int32, count=min(chunk_rows, n - begin) * tables).reshape(-1, tables)
                self._check_chunk(chunk, begin, cardinalities)

    def _check_chunk(self, chunk: np.ndarray, begin: int, cardinalities: np.ndarray) -> None:
        """Raise naming the first id of ``chunk`` (samples ``begin ..``) outside its table."""
        if len(chunk) == 0 or ((chunk.min(axis=0) >= 0).all() and (chunk.max(axis=0) < cardinalities).all()):
            return
        sample, table = np.argwhere((chunk < 0) | (chunk >= cardinalities))[0]
        raise StoreError(
            f"{self.path / 'sparse.npy'}: sample {begin + sample} has id {chunk[sample, table]} in table "
            f"{self.table_names[table]}, outside [0, {cardinalities[table]}) of meta.json; the store is "
            f"corrupt or meta.json does not belong to it: rebuild it with 'hybrid preprocess' or 'hybrid synth'")

    def check_values(self, chunk_rows: int = 1 << 16) -> None:
        """Raise unless every label is 0 or 1 and every dense feature is finite (reads both files once).

        A NaN or a 2 in the labels, or an inf in the dense features, would
        not fail anything: the loss would turn NaN, or the model would fit
        nonsense, many iterations later and without a word.
        """
        for name, array, bad in (("labels", self._labels, lambda x: (x != 0) & (x != 1)),
                                 ("dense", self._dense, lambda x: ~np.isfinite(x))):
            for begin in range(0, len(array), chunk_rows):
                wrong = np.flatnonzero(bad(np.asarray(array[begin:begin + chunk_rows])).reshape(
                    min(chunk_rows, len(array) - begin), -1).any(axis=1))
                if len(wrong):
                    sample = begin + int(wrong[0])
                    values = np.atleast_1d(np.asarray(array[sample]))
                    column = int(np.flatnonzero(bad(values))[0])
                    what = (f"a label that is not 0 or 1 ({values[column].item()})" if name == "labels" else
                            f"a dense feature that is not finite (feature {column}: {values[column].item()})")
                    raise StoreError(f"{self.path / (name + '.npy')}: sample {sample} has {what}; fix the input "
                                     f"and rebuild the store")

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
