"""Criteo-format text files from the synthetic Criteo profile, for measuring ``hybrid preprocess``.

A line is what a Criteo Terabyte day holds: a 0/1 label, 13 integer counts and
26 categorical values as 8 hex digits (a hash of the value), tab-separated, an
empty field where a value is missing. Values come from
:class:`~hybrid.data.synthetic.SyntheticGenerator`'s Criteo profile (its
skew and locality, so the dictionaries grow as a real day's do); a row id
becomes the hex of a hash of (table, id), row 0 of each table is written as
missing, and a count of 0 as missing. ``long_values`` appends 8 more hex
digits to every value (the longer values of a wider hash).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from hybrid.counter_hash import hash3, stream_id
from hybrid.data.formats import CRITEO
from hybrid.data.synthetic import CRITEO_KAGGLE, CHUNK, SyntheticGenerator

_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _hex(values: np.ndarray, digits: int) -> np.ndarray:
    """``values`` (uint64) as fixed-width lower-case hex, ``digits`` long (bytes, dtype S<digits>)."""
    shifts = np.arange(4 * (digits - 1), -1, -4, dtype=np.uint64)
    nibbles = (values[:, None] >> shifts) & np.uint64(15)
    return _HEX_DIGITS[nibbles].view(f"S{digits}").ravel()


def _text(column: np.ndarray, missing: np.ndarray) -> pa.Array:
    return pc.if_else(pa.array(missing), "", pa.array(column, pa.binary()).cast(pa.string()))


def write_criteo_text(path: str | Path, *, lines: int, scale: float = 0.05, seed: int = 0,
                      long_values: bool = False, progress: Optional[Callable[[int], None]] = None) -> Path:
    """Write ``lines`` Criteo-format lines to ``path``; the same arguments write the same bytes."""
    path = Path(path)
    generator = SyntheticGenerator(CRITEO_KAGGLE, rows=lines, scale=scale, seed=seed)
    digits = 16 if long_values else 8
    with pacsv.CSVWriter(path, pa.schema([(c, pa.string()) for c in CRITEO.columns]),
                         write_options=pacsv.WriteOptions(include_header=False, delimiter="\t",
                                                          quoting_style="none")) as writer:
        for start in range(0, lines, CHUNK):
            size = min(CHUNK, lines - start)
            sparse, dense, labels = generator.chunk(start, size)
            columns = [pa.array(labels.astype(np.int8)).cast(pa.string())]
            for j in range(dense.shape[1]):
                counts = np.rint(np.expm1(dense[:, j].astype(np.float64))).astype(np.int64)
                columns.append(_text(counts.astype(str).astype(np.bytes_), counts == 0))
            for t in range(sparse.shape[1]):
                ids = sparse[:, t].astype(np.uint64)
                hashed = hash3(seed, stream_id("criteo-text", t), ids)
                columns.append(_text(_hex(hashed, digits), ids == 0))
            writer.write_batch(pa.record_batch(columns, names=list(CRITEO.columns)))
            if progress:
                progress(size)
    return path
