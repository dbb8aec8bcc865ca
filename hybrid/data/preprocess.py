"""``hybrid preprocess``: public dataset files -> the binary store.

Two streaming passes over the input (files larger than memory are fine):

1. count rows and the frequency of every categorical value per table;
2. map values to contiguous per-table ids and write the store.

Ids per table: 0 = missing, 1 = rare (seen fewer than ``min_count`` times),
then the vocabulary by descending frequency (ties by value), so the order is
the same however the input is cut into batches. The vocabulary is stored in
``vocab/<table>.txt`` so ids can be decoded. Dense features become
``log(1 + max(x, 0))`` as in DLRM, missing ones 0. MovieLens ratings become
``rating >= rating_threshold`` labels and are ordered by timestamp (the file
order of ml-100k is not chronological; online training is).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from hybrid.data.formats import Format, FormatError, read_batches, resolve_format
from hybrid.data.store import StoreWriter

MISSING_ID, RARE_ID, FIRST_VALUE_ID = 0, 1, 2
_COMPACT_EVERY = 16


class _ValueCounter:
    """Running value counts of one column, kept as Arrow tables."""

    def __init__(self):
        self.parts: list[pa.Table] = []

    def add(self, values: pa.Array) -> None:
        counts = pc.value_counts(values)
        self.parts.append(pa.table({"value": counts.field("values"), "count": counts.field("counts")}))
        if len(self.parts) >= _COMPACT_EVERY:
            self.parts = [self._compact()]

    def _compact(self) -> pa.Table:
        merged = pa.concat_tables(self.parts).group_by("value").aggregate([("count", "sum")])
        return merged.rename_columns(["value", "count"])

    def vocabulary(self, missing: Sequence[str], min_count: int) -> pa.Array:
        """Values seen at least ``min_count`` times, most frequent first."""
        table = self._compact()
        keep = pc.and_(pc.invert(pc.is_in(table["value"], value_set=pa.array(missing, pa.string()))),
                       pc.greater_equal(table["count"], min_count))
        table = table.filter(keep).sort_by([("count", "descending"), ("value", "ascending")])
        return table["value"].combine_chunks()


def _labels(batch: pa.RecordBatch, fmt: Format, rating_threshold: float) -> np.ndarray:
    column = batch.column(fmt.label)
    if fmt.rating_label:
        ratings = pc.cast(column, pa.float64()).to_numpy()
        return (ratings >= rating_threshold).astype(np.float32)
    return pc.cast(column, pa.float32()).to_numpy()


def _dense(batch: pa.RecordBatch, fmt: Format) -> np.ndarray:
    out = np.zeros((batch.num_rows, len(fmt.dense)), dtype=np.float32)
    missing = pa.array(fmt.missing, pa.string())
    for j, name in enumerate(fmt.dense):
        column = batch.column(name)
        column = pc.if_else(pc.is_in(column, value_set=missing), "0", column)
        values = pc.cast(column, pa.float64()).to_numpy()
        out[:, j] = np.log1p(np.maximum(values, 0.0))
    return out


def _sparse(batch: pa.RecordBatch, fmt: Format, lookups: list[pd.Index]) -> np.ndarray:
    out = np.empty((batch.num_rows, len(fmt.sparse)), dtype=np.int32)
    missing = pa.array(fmt.missing, pa.string())
    for j, (name, lookup) in enumerate(zip(fmt.sparse, lookups)):
        column = batch.column(name)
        is_missing = pc.is_in(column, value_set=missing).to_numpy(zero_copy_only=False)
        index = lookup.get_indexer(column.to_numpy(zero_copy_only=False))
        out[:, j] = np.where(is_missing, MISSING_ID, np.where(index < 0, RARE_ID, index + FIRST_VALUE_ID))
    return out


def preprocess(inputs: Sequence[str | Path], out_dir: str | Path, *, format_name: str,
               min_count: int = 1, rating_threshold: float = 4.0, keep_file_order: bool = False,
               force: bool = False, progress: Optional[Callable[[str, int], None]] = None) -> dict:
    """Convert ``inputs`` (in order, e.g. Criteo Terabyte days) into a store at ``out_dir``.

    ``progress(stage, rows)`` is called after each batch. Any malformed line
    raises :class:`FormatError` and leaves nothing at ``out_dir``.
    """
    if not inputs:
        raise ValueError("no input files given")
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    paths = [Path(p) for p in inputs]
    formats = [resolve_format(format_name, p) if p.is_file() else None for p in paths]
    for path, fmt in zip(paths, formats):
        if fmt is None:
            raise FormatError(f"{path}: no such file")
    fmt = formats[0]
    if any(f.columns != fmt.columns for f in formats):
        raise FormatError(f"inputs mix layouts of format {format_name}: {[str(p) for p in paths]}")
    report = progress or (lambda stage, rows: None)

    counters = [_ValueCounter() for _ in fmt.sparse]
    n_samples = 0
    for path, f in zip(paths, formats):
        for batch in read_batches(path, f):
            for counter, name in zip(counters, fmt.sparse):
                counter.add(batch.column(name))
            n_samples += batch.num_rows
            report("count", batch.num_rows)

    vocabularies = [c.vocabulary(fmt.missing, min_count) for c in counters]
    lookups = [pd.Index(v.to_numpy(zero_copy_only=False)) for v in vocabularies]
    cardinalities = [FIRST_VALUE_ID + len(v) for v in vocabularies]
    source = {"kind": "preprocessed", "format": format_name, "files": [str(p) for p in paths],
              "min_count": min_count, "time_ordered": bool(fmt.time_column and not keep_file_order)}
    if fmt.rating_label:
        source["rating_threshold"] = rating_threshold
    table_names = list(fmt.sparse)

    with StoreWriter(out_dir, n_samples=n_samples, table_names=table_names, n_dense=len(fmt.dense),
                     source=source, force=force) as writer:
        chunks = []
        for path, f in zip(paths, formats):
            for batch in read_batches(path, f):
                chunk = (_sparse(batch, fmt, lookups), _dense(batch, fmt), _labels(batch, fmt, rating_threshold))
                if source["time_ordered"]:
                    chunks.append(chunk + (pc.cast(batch.column(fmt.time_column), pa.int64()).to_numpy(),))
                else:
                    writer.append(*chunk)
                report("write", batch.num_rows)
        if source["time_ordered"]:
            sparse, dense, labels, times = (np.concatenate(parts) for parts in zip(*chunks))
            order = np.argsort(times, kind="stable")
            writer.append(sparse[order], dense[order], labels[order])
        for name, vocabulary in zip(table_names, vocabularies):
            _write_vocabulary(writer.vocab_dir / f"{name}.txt", vocabulary)
        return writer.commit(cardinalities)


def _write_vocabulary(path: Path, vocabulary: pa.Array) -> None:
    """One value per line; line k (0-based) is id k + FIRST_VALUE_ID."""
    with open(path, "w", encoding="utf-8") as f:
        for value in vocabulary.to_pylist():
            f.write(value)
            f.write("\n")


def read_vocabulary(store_dir: str | Path, table: str) -> list[str]:
    """Decoding table of ``table``: entry ``id`` is the original value (None = missing/rare)."""
    path = Path(store_dir) / "vocab" / f"{table}.txt"
    values = path.read_text(encoding="utf-8").split("\n")[:-1]
    return [None, None] + values
