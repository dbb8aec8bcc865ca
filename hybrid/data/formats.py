"""The public dataset formats ``hybrid preprocess`` reads, and a validating reader.

Each format is a declarative :class:`Format`: its columns, which are label,
dense and categorical, what a missing value looks like and what a valid value
looks like. :func:`read_batches` streams a file through pyarrow in column
batches and stops at the first malformed line with ``file:line: what is
wrong`` (:class:`FormatError`).
"""
from __future__ import annotations

import codecs
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

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


def _check_start(path: Path, fmt: Format) -> None:
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


def read_batches(path: str | Path, fmt: Format) -> Iterator[pa.RecordBatch]:
    """Validated string column batches of ``path``, in file order."""
    path = Path(path)
    _check_start(path, fmt)
    header_lines = 1 if fmt.header else 0
    source: str | io.BytesIO = str(path)
    delimiter = fmt.delimiter
    if len(delimiter) > 1:
        # pyarrow splits on one character; the only such format (MovieLens 1M) is small.
        source = io.BytesIO(path.read_bytes().replace(delimiter.encode(), b"\x1f"))
        delimiter = "\x1f"

    bad_rows = []

    def on_invalid(row) -> str:
        bad_rows.append(row)
        return "error"

    def malformed(err: pa.ArrowInvalid) -> FormatError:
        if bad_rows:
            row = bad_rows[0]
            return FormatError(f"{path}:{row.number}: expected {row.expected_columns} columns, "
                               f"found {row.actual_columns}: {_shown(row.text, 200)}")
        return FormatError(f"{path}: {err}")

    def unreadable(err: OSError) -> FormatError:
        """E.g. a .gz cut short by an interrupted download."""
        return FormatError(f"{path}: cannot be read past line {lines_before}: {err} (a truncated or damaged "
                           f"file? fetch it again)")

    lines_before = header_lines
    try:
        # The reader parses its first block when it opens, so that can fail too.
        reader = pacsv.open_csv(
            source,
            read_options=pacsv.ReadOptions(column_names=list(fmt.columns), skip_rows=header_lines,
                                           use_threads=False, block_size=BLOCK_BYTES),
            parse_options=pacsv.ParseOptions(delimiter=delimiter, quote_char=False, ignore_empty_lines=False,
                                             invalid_row_handler=on_invalid),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in fmt.columns},
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
        _validate(batch, fmt, path, lines_before)
        lines_before += batch.num_rows
        yield batch
    if lines_before == header_lines:
        raise FormatError(f"{path}: no data lines")


def _validate(batch: pa.RecordBatch, fmt: Format, path: Path, lines_before: int) -> None:
    checks = [(fmt.label, fmt.label_pattern, False)]
    checks += [(c, fmt.dense_pattern, True) for c in fmt.dense]
    if fmt.sparse_pattern:
        checks += [(c, fmt.sparse_pattern, True) for c in fmt.sparse]
    if fmt.time_column:
        checks.append((fmt.time_column, _UINT, False))
    missing = pa.array(fmt.missing, pa.string())
    for column, pattern, may_be_missing in checks:
        values = batch.column(column)
        ok = pc.match_substring_regex(values, pattern)
        if may_be_missing:
            ok = pc.or_(ok, pc.is_in(values, value_set=missing))
        if not pc.all(ok).as_py():
            index = pc.index(ok, False).as_py()
            value = values[index].as_py()
            what = "empty line" if _is_empty_row(batch, index) else f"column {column}: invalid value {_shown(value)}"
            if lines_before + index == 0 and not fmt.header and _is_words(batch, 0):
                what += (f" (a header line? {fmt.name} files have none: remove it, e.g. with "
                         f"'tail -n +2 {path.name} > {path.stem}-noheader{path.suffix}')")
            raise FormatError(f"{path}:{lines_before + index + 1}: {what}")


def _is_words(batch: pa.RecordBatch, index: int) -> bool:
    """Whether row ``index`` holds only names (a header), not the numbers and hashes of data lines."""
    fields = [batch.column(i)[index].as_py() for i in range(batch.num_columns)]
    return all(f and f[0].isalpha() and f.replace("_", "").isalnum() for f in fields)


def _is_empty_row(batch: pa.RecordBatch, index: int) -> bool:
    return all(batch.column(i)[index].as_py() in ("", None) for i in range(batch.num_columns))
