"""The public dataset formats ``hybrid preprocess`` reads, and a validating reader.

Each format is a declarative :class:`Format`: its columns, which are label,
dense and categorical, what a missing value looks like and what a valid value
looks like. :func:`read_batches` streams a file through pyarrow in column
batches and stops at the first malformed line with ``file:line: what is
wrong`` (:class:`FormatError`).
"""
from __future__ import annotations

import codecs
import functools
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from hybrid._ext.text_columns import KINDS, check_column

_HEX = r"^[0-9a-fA-F]+$"
_INT = r"^-?[0-9]+$"
_UINT = r"^[0-9]+$"
_NUMBER = r"^-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$"
BLOCK_BYTES = 16 << 20


class FormatError(ValueError):
    """A malformed input line; the message starts with ``file:line:``."""


@dataclass(frozen=True)
class Format:
    name: str
    delimiter: str
    columns: tuple[str, ...]
    label: str
    dense: tuple[str, ...]
    sparse: tuple[str, ...]
    label_pattern: str
    dense_pattern: str = _INT
    sparse_pattern: Optional[str] = None
    missing: tuple[str, ...] = ("",)
    header: bool = False  # the first line must be the column names
    header_types: tuple[str, ...] = ()  # typed header (RecBole): line 1 is ``name:type`` per column
    rating_label: bool = False  # label = rating >= threshold (MovieLens)
    time_column: Optional[str] = None  # rows are ordered by it (MovieLens)

    @property
    def n_columns(self) -> int:
        return len(self.columns)

    @property
    def header_fields(self) -> tuple[str, ...]:
        """The expected first line, split (only for formats with a header)."""
        if self.header_types:
            return tuple(f"{c}:{t}" for c, t in zip(self.columns, self.header_types))
        return self.columns


_CRITEO_DENSE = tuple(f"I{i}" for i in range(1, 14))
_CRITEO_SPARSE = tuple(f"C{i}" for i in range(1, 27))
CRITEO = Format(
    name="criteo", delimiter="\t", columns=("label",) + _CRITEO_DENSE + _CRITEO_SPARSE,
    label="label", dense=_CRITEO_DENSE, sparse=_CRITEO_SPARSE,
    label_pattern=r"^[01]$", dense_pattern=_INT, sparse_pattern=_HEX,
)

_AVAZU_SPARSE = ("hour", "C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id",
                 "app_domain", "app_category", "device_id", "device_ip", "device_model", "device_type",
                 "device_conn_type", "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21")
AVAZU = Format(
    name="avazu", delimiter=",", columns=("id", "click") + _AVAZU_SPARSE, label="click",
    dense=(), sparse=_AVAZU_SPARSE, label_pattern=r"^[01]$", header=True,
)

_SEARCH_SPARSE = ("product_age_group", "device_type", "audience_id", "product_gender", "product_brand",
                  "product_category1", "product_category2", "product_category3", "product_category4",
                  "product_category5", "product_category6", "product_category7", "product_country",
                  "product_id", "product_title", "partner_id", "user_id")
CRITEO_SEARCH = Format(
    name="criteo-search", delimiter="\t",
    columns=("Sale", "SalesAmountInEuro", "time_delay_for_conversion", "click_timestamp",
             "nb_clicks_1week", "product_price") + _SEARCH_SPARSE,
    label="Sale", dense=("nb_clicks_1week", "product_price"), sparse=_SEARCH_SPARSE,
    label_pattern=r"^[01]$", dense_pattern=_NUMBER, missing=("", "-1"),
)

_ML = dict(label="rating", dense=(), sparse=("user", "item"), label_pattern=_NUMBER,
           sparse_pattern=_UINT, rating_label=True, time_column="timestamp")
MOVIELENS_100K = Format(name="movielens", delimiter="\t", columns=("user", "item", "rating", "timestamp"), **_ML)
MOVIELENS_1M = Format(name="movielens", delimiter="::", columns=("user", "item", "rating", "timestamp"), **_ML)
MOVIELENS_CSV = Format(name="movielens", delimiter=",", columns=("userId", "movieId", "rating", "timestamp"),
                       **{**_ML, "sparse": ("userId", "movieId")}, header=True)
# RecBole's atomic file (ml-100k.inter, shipped in its wheel: see hybrid/data/fetch.py): u.data with a
# typed header. Timestamps are typed float there but are whole seconds, checked as such.
MOVIELENS_INTER = Format(name="movielens", delimiter="\t", columns=("user_id", "item_id", "rating", "timestamp"),
                         **{**_ML, "sparse": ("user_id", "item_id")}, header=True,
                         header_types=("token", "token", "float", "float"))

FORMAT_NAMES = ("criteo", "avazu", "movielens", "criteo-search")


def resolve_format(name: str, path: Path) -> Format:
    """The :class:`Format` of ``path`` for a format name (MovieLens by its file layout)."""
    if name == "criteo":
        return CRITEO
    if name == "avazu":
        return AVAZU
    if name == "criteo-search":
        return CRITEO_SEARCH
    if name == "movielens":
        first = _first_line(path)
        if path.suffix == ".inter":
            return MOVIELENS_INTER
        if "::" in first:
            return MOVIELENS_1M
        if _is_typed_header(first):
            return MOVIELENS_INTER
        if first.startswith("userId") or path.suffix == ".csv":
            return MOVIELENS_CSV
        return MOVIELENS_100K
    raise ValueError(f"unknown format {name!r}; expected one of {', '.join(FORMAT_NAMES)}")


def _is_typed_header(line: str) -> bool:
    """A RecBole header: tab separated ``name:type`` fields (data lines are numbers)."""
    fields = line.split("\t")
    return len(fields) > 1 and all(f.count(":") == 1 and not f.startswith(":") and not f.endswith(":")
                                   for f in fields)


def _first_line(path: Path) -> str:
    with open(path, "rb") as f:
        return f.readline().decode("utf-8", errors="replace").rstrip("\r\n")


_COMPRESSED = (".gz", ".bz2", ".zst", ".lz4", ".xz")  # pyarrow decompresses these by their suffix


def _shown(value: str, limit: int = 80) -> str:
    """A field as an error message shows it: quoted, escaped, cut to ``limit`` characters."""
    return repr(value[:limit]) + (f" ... ({len(value)} characters)" if len(value) > limit else "")


def _check_text(path: Path) -> None:
    """Refuse a file that is not text (a NUL byte or invalid UTF-8 in its first 64 KiB), before the parser
    reports it as thousands of malformed rows."""
    if path.suffix in _COMPRESSED:
        return
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)  # a character cut at the end is fine
        text = b"\x00" not in head
    except UnicodeDecodeError:
        text = False
    if not text:
        raise FormatError(f"{path}: not a text file (binary data in its first {len(head)} bytes); give the "
                          f"dataset's text files, or a compressed file ending in one of {', '.join(_COMPRESSED)}")


def check_file(path: Path, fmt: Format) -> None:
    """What can be said of a whole file before any part of it is read (by :func:`read_batches`, which does
    not check again): it exists, is not empty, is text and has its header."""
    if not path.is_file():
        raise FormatError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise FormatError(f"{path}: empty file")
    _check_text(path)
    if fmt.header:
        found = _first_line(path).split(fmt.delimiter)
        if tuple(found) != fmt.header_fields:
            raise FormatError(f"{path}:1: expected the header {fmt.delimiter.join(fmt.header_fields)!r}, "
                              f"found {_shown(fmt.delimiter.join(found), 200)}")


def split_ranges(path: Path, fmt: Format, part_bytes: int) -> list[tuple[int, int]]:
    """Byte ranges ``[start, end)`` of about ``part_bytes`` that together cover ``path``, each starting at a
    line; one range ``(0, -1)`` (the whole file) where ranges cannot be read alone: a compressed file, a
    delimiter of several characters.

    The ranges depend on the file and ``part_bytes`` only, never on who reads them.
    """
    size = path.stat().st_size
    if path.suffix in _COMPRESSED or len(fmt.delimiter) > 1 or size <= part_bytes:
        return [(0, -1)]
    bounds = [0]
    with open(path, "rb") as f:
        for cut in range(part_bytes, size, part_bytes):
            if cut <= bounds[-1]:
                continue
            f.seek(cut - 1)
            while True:  # the next line start at or after ``cut``
                chunk = f.read(1 << 16)
                if not chunk:
                    cut = size
                    break
                newline = chunk.find(b"\n")
                if newline >= 0:
                    cut = f.tell() - len(chunk) + newline + 1
                    break
            if cut < size:
                bounds.append(cut)
    bounds.append(size)
    return list(zip(bounds[:-1], bounds[1:]))


def line_at(path: Path, offset: int) -> int:
    """The 1-based number of the line starting at byte ``offset`` (counted only when an error needs it)."""
    lines, done = 1, 0
    with open(path, "rb") as f:
        while done < offset:
            chunk = f.read(min(16 << 20, offset - done))
            if not chunk:
                break
            lines += chunk.count(b"\n")
            done += len(chunk)
    return lines


def read_batches(path: str | Path, fmt: Format, start: int = 0, end: int = -1,
                 bad_lines: Optional[list] = None) -> Iterator[pa.RecordBatch]:
    """Validated string column batches of ``path`` (bytes ``[start, end)``, ``end`` -1: to the end), in file
    order, of a file :func:`check_file` passed. A malformed line raises :class:`FormatError` naming its file
    and line; with ``bad_lines`` (a list) it is left out and its line number appended instead.
    """
    path = Path(path)
    header_lines = 1 if fmt.header and start == 0 else 0
    source: str | io.BytesIO | pa.BufferReader = str(path)
    delimiter = fmt.delimiter
    if len(delimiter) > 1:
        # pyarrow splits on one character; the only such format (MovieLens 1M) is small.
        source = io.BytesIO(path.read_bytes().replace(delimiter.encode(), b"\x1f"))
        delimiter = "\x1f"
    elif start > 0 or end >= 0:
        mapped = pa.memory_map(str(path))  # the range's buffer keeps the mapping alive
        mapped.seek(start)
        source = pa.BufferReader(mapped.read_buffer((end if end >= 0 else mapped.size()) - start))
    first_line = functools.cache(lambda: line_at(path, start))  # of the range: counted only if needed

    bad_rows = []
    parser_skipped: list[int] = []  # lines of the range the parser left out (wrong column count), in order

    def on_invalid(row) -> str:
        if bad_lines is not None:
            parser_skipped.append(row.number)
            return "skip"
        bad_rows.append(row)
        return "error"

    def malformed(err: pa.ArrowInvalid) -> FormatError:
        if bad_rows:
            row = bad_rows[0]
            return FormatError(f"{path}:{first_line() - 1 + row.number}: expected {row.expected_columns} "
                               f"columns, found {row.actual_columns}: {_shown(row.text, 200)}")
        return FormatError(f"{path}: {err}")

    def unreadable(err: OSError) -> FormatError:
        """E.g. a .gz cut short by an interrupted download."""
        return FormatError(f"{path}: cannot be read past line {first_line() - 1 + header_lines + rows_before}: "
                           f"{err} (a truncated or damaged file? fetch it again)")

    def lines_of(rows: np.ndarray) -> np.ndarray:
        """The file's 1-based line numbers of the range's data rows ``rows`` (past the lines left out)."""
        return first_line() - 1 + _stream_lines(rows, np.asarray(parser_skipped, dtype=np.int64), header_lines)

    rows_before = 0
    try:
        # The reader parses its first block when it opens, so that can fail too.
        reader = pacsv.open_csv(
            source,
            read_options=pacsv.ReadOptions(column_names=list(fmt.columns), skip_rows=header_lines,
                                           use_threads=False, block_size=BLOCK_BYTES),
            parse_options=pacsv.ParseOptions(delimiter=delimiter, quote_char=False, ignore_empty_lines=False,
                                             invalid_row_handler=on_invalid),
            convert_options=pacsv.ConvertOptions(column_types=column_types(fmt),
                                                 strings_can_be_null=False, quoted_strings_can_be_null=False),
        )
    except pa.ArrowInvalid as err:
        raise malformed(err) from None
    except OSError as err:
        raise unreadable(err) from None
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
        except pa.ArrowInvalid as err:
            raise malformed(err) from None
        except OSError as err:
            raise unreadable(err) from None
        first = rows_before
        batch_out = _validate(batch, fmt, path, lambda rows: lines_of(first + rows), bad_lines)
        rows_before += batch.num_rows
        yield batch_out
    if bad_lines is not None:
        bad_lines.extend(first_line() - 1 + number for number in parser_skipped)
    if rows_before == 0 and start == 0 and not parser_skipped:
        raise FormatError(f"{path}: no data lines")


def _stream_lines(rows: np.ndarray, skipped: np.ndarray, header: int) -> np.ndarray:
    """Line numbers (1-based, in the stream) of data rows ``rows`` when the lines ``skipped`` (sorted) are
    not rows: the smallest fixed point of ``line = header + row + 1 + |skipped <= line|``."""
    rows = np.asarray(rows, dtype=np.int64)
    lines = header + rows + 1
    while True:
        moved = header + rows + 1 + np.searchsorted(skipped, lines, side="right")
        if np.array_equal(moved, lines):
            return lines
        lines = moved


# patterns a kernel checks (hybrid._ext.text_columns) as exactly as the regular expression
_KERNEL_KINDS = {r"^[01]$": "bit", _UINT: "uint", _INT: "int", _HEX: "hex"}


def kernel_kind(pattern: str, fmt: Format, may_be_missing: bool) -> Optional[str]:
    """The kernel that checks ``pattern``, or None (a regular expression checks it): a missing value other
    than the empty string is the regular expression's to allow."""
    if may_be_missing and set(fmt.missing) != {""}:
        return None
    return _KERNEL_KINDS.get(pattern)


def text_array(values: Sequence[str], type_: pa.DataType = pa.string()) -> pa.Array:
    """``values`` as an Arrow string (or binary) array, built from buffers: ``pa.array`` would import pandas,
    a fifth of a second in every worker process."""
    data = [v.encode() for v in values]
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in data])])
    wide = type_ in (pa.large_string(), pa.large_binary())
    return pa.Array.from_buffers(type_, len(data), [None, pa.py_buffer(offsets.astype(np.int64 if wide else np.int32)),
                                                   pa.py_buffer(b"".join(data))])


def from_numbers(values: np.ndarray) -> pa.Array:
    """A 1-D NumPy array of numbers as an Arrow array, sharing its memory (``pa.array`` would import pandas)."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])


def numbers(array: pa.Array) -> np.ndarray:
    """A primitive Arrow array without nulls in NumPy, without a copy (``to_numpy`` would import pandas);
    booleans come out as bools, one byte each."""
    if array.null_count:
        raise ValueError("an array with nulls has no plain NumPy view")
    if array.type == pa.bool_():
        return np.unpackbits(np.frombuffer(array.buffers()[1], np.uint8), count=array.offset + len(array),
                             bitorder="little")[array.offset:].astype(bool)
    dtype = np.dtype(array.type.to_pandas_dtype())
    return np.frombuffer(array.buffers()[1], dtype)[array.offset:array.offset + len(array)]


def string_buffers(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The int32 offsets (one per value, plus one) and the bytes of a string column, without copies."""
    _, offsets, data = column.buffers()
    offsets = np.frombuffer(offsets, dtype=np.int32)[column.offset:column.offset + len(column) + 1]
    return offsets, (np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8))


def _checks(fmt: Format) -> list[tuple[str, str, bool]]:
    """(column, pattern, may be missing), in the order a line's columns are reported."""
    checks = [(fmt.label, fmt.label_pattern, False)]
    checks += [(c, fmt.dense_pattern, True) for c in fmt.dense]
    if fmt.sparse_pattern:
        checks += [(c, fmt.sparse_pattern, True) for c in fmt.sparse]
    if fmt.time_column:
        checks.append((fmt.time_column, _UINT, False))
    return sorted(checks, key=lambda check: fmt.columns.index(check[0]))


def _valid(batch: pa.RecordBatch, fmt: Format, column: str, pattern: str, may_be_missing: bool,
           every: bool) -> tuple[int, Optional[np.ndarray]]:
    """The first invalid row of ``column`` (-1: none) and, if ``every``, each row's validity."""
    values = batch.column(column)
    kind = kernel_kind(pattern, fmt, may_be_missing)
    if kind is not None:
        ok = np.empty(len(values), dtype=np.uint8) if every else None
        first = check_column(*string_buffers(values), KINDS[kind], may_be_missing, ok)
        return first, None if ok is None else ok.view(bool)
    matched = pc.match_substring_regex(values, pattern)
    if may_be_missing:
        matched = pc.or_(matched, pc.is_in(values, value_set=text_array(fmt.missing, values.type)))
    if pc.all(matched).as_py():
        return -1, np.ones(len(values), dtype=bool) if every else None
    return pc.index(matched, False).as_py(), numbers(matched) if every else None


def _validate(batch: pa.RecordBatch, fmt: Format, path: Path, lines_of: Callable[[np.ndarray], np.ndarray],
              bad_lines: Optional[list]) -> pa.RecordBatch:
    """``batch`` if every value matches its column's pattern; else the error of the first bad line, or (with
    ``bad_lines``) the batch without its bad lines, their numbers appended. ``lines_of(rows)``: the file's
    line numbers of the batch's rows."""
    found = [(_valid(batch, fmt, column, pattern, missing, bad_lines is not None), column)
             for column, pattern, missing in _checks(fmt)]
    bad = [(first, column) for (first, _), column in found if first >= 0]
    if not bad:
        return batch
    if bad_lines is not None:
        keep = np.logical_and.reduce([ok for (_, ok), _ in found])
        bad_lines.extend(int(line) for line in lines_of(np.flatnonzero(~keep)))
        return batch.filter(pa.BooleanArray.from_buffers(
            pa.bool_(), len(keep), [None, pa.py_buffer(np.packbits(keep, bitorder="little"))]))
    index, column = min(bad, key=lambda b: (b[0], fmt.columns.index(b[1])))
    value = _field(batch, column, index)
    line = int(lines_of(np.array([index]))[0])
    what = "empty line" if _is_empty_row(batch, index) else f"column {column}: invalid value {_shown(value)}"
    if line == 1 and not fmt.header and _is_words(batch, 0):
        what += (f" (a header line? {fmt.name} files have none: remove it, e.g. with "
                 f"'tail -n +2 {path.name} > {path.stem}-noheader{path.suffix}')")
    raise FormatError(f"{path}:{line}: {what}")


def column_types(fmt: Format) -> dict[str, pa.DataType]:
    """Bytes for the columns a kernel checks (their languages are ASCII, so the parser's UTF-8 check would
    be a second pass for nothing), text for the others."""
    binary = {column for column, pattern, missing in _checks(fmt) if kernel_kind(pattern, fmt, missing)}
    return {c: pa.binary() if c in binary else pa.string() for c in fmt.columns}


def _field(batch: pa.RecordBatch, column: int | str, index: int) -> str:
    """One value as text, whether its column was read as bytes or as text."""
    value = batch.column(column)[index].as_py()
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else (value or "")


def _is_words(batch: pa.RecordBatch, index: int) -> bool:
    """Whether row ``index`` holds only names (a header), not the numbers and hashes of data lines."""
    fields = [_field(batch, i, index) for i in range(batch.num_columns)]
    return all(f and f[0].isalpha() and f.replace("_", "").isalnum() for f in fields)


def _is_empty_row(batch: pa.RecordBatch, index: int) -> bool:
    return all(_field(batch, i, index) == "" for i in range(batch.num_columns))
