"""``hybrid preprocess``: public dataset files -> the binary store, in parallel and resumable.

The input is cut into parts: byte ranges of about ``part_bytes`` (default:
1/64 of the input, within 4-64 MiB) starting at a line (a compressed file is
one part). Three phases follow, each a set of
tasks that local processes or MPI ranks share (:mod:`hybrid.data.task_pool`):

1. **scan** (one task per part): parse, validate, encode every categorical
   column into the part's own dictionary (first-seen ids and counts); the
   part's ids, dense features, labels and dictionaries go to the work
   directory, published by a rename, so a part is there whole or not at all;
2. **vocabulary** (one task per column): merge the parts' dictionaries, so
   counts are global (``min_count`` too); order the vocabulary; write each
   part's table from its own ids to the store's;
3. **write** (one task per part): the part's rows into the store's arrays.

Ids per table: 0 = missing, 1 = rare (seen fewer than ``min_count`` times),
then the vocabulary by descending frequency (ties by value, bytewise), so the
store depends on the input and the options only: not on the part size, the
process count or the ranks (``tests/unit/data/test_preprocess.py``, and
``tests/mpi/test_preprocess_mpi.py`` at 1 to 3 ranks). The vocabulary is
stored in ``vocab/<table>.txt`` so ids can be decoded. Dense features become
``log(1 + max(x, 0))`` as in DLRM, missing ones 0. MovieLens ratings become
``rating >= rating_threshold`` labels and are ordered by timestamp (the file
order of ml-100k is not chronological; online training is).

The work directory (``.<store>.work`` beside the store) keeps finished parts
when a run is killed or preempted; a rerun with the same inputs (same size
and modification time) takes them up. A malformed line raises
:class:`FormatError` naming its file and line and leaves nothing behind;
with ``skip_bad_lines`` such lines are left out and counted instead.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hybrid._ext.text_columns import StringDictionary, bits, log1p_ints, remap_ids
from hybrid.data.formats import (Format, FormatError, check_file, kernel_kind, read_batches, resolve_format,
                                 from_numbers, numbers, split_ranges, string_buffers, text_array)
from hybrid.data.store import StoreError, StoreWriter
from hybrid.data.task_pool import TaskPool

MISSING_ID, RARE_ID, FIRST_VALUE_ID = 0, 1, 2
PARTS_PER_INPUT = 64  # the default part size cuts the whole input into about this many parts ...
PART_BYTES_RANGE = (4 << 20, 64 << 20)  # ... of this many bytes at least and at most
WRITE_ROWS = 1 << 18  # rows a write task remaps at once
PART_ARRAYS = ("ids", "dense", "labels", "times")  # a scanned part's arrays, raw files of its rows in order


def default_part_bytes(paths: Sequence[Path]) -> int:
    """A part size from the input alone (never from the process count, so that a rerun on other processes
    resumes the same parts): enough parts to balance 16 processes, few enough that each is worth a task."""
    low, high = PART_BYTES_RANGE
    return int(min(high, max(low, sum(p.stat().st_size for p in paths) // PARTS_PER_INPUT)))


@dataclass(frozen=True)
class Part:
    """Bytes ``[start, end)`` of one input file (``end`` -1: all of it)."""

    index: int
    path: str
    start: int
    end: int
    key: str  # names its directory: changes with the file, the range and what the scan produces

    @property
    def size(self) -> int:
        return (os.path.getsize(self.path) if self.end < 0 else self.end) - self.start


@dataclass(frozen=True)
class ScanOptions:
    format_name: str
    rating_threshold: float
    skip_bad_lines: bool


def plan_parts(paths: Sequence[Path], formats: Sequence[Format], options: ScanOptions,
               part_bytes: int) -> list[Part]:
    """Every file's byte ranges, in input order."""
    parts = []
    for path, fmt in zip(paths, formats):
        stat = path.stat()
        for start, end in split_ranges(path, fmt, part_bytes):
            key = hashlib.sha256(json.dumps([str(path.resolve()), stat.st_size, stat.st_mtime_ns, start, end,
                                             fmt.name, fmt.columns, options.rating_threshold,
                                             options.skip_bad_lines]).encode()).hexdigest()[:20]
            parts.append(Part(len(parts), str(path), start, end, key))
    return parts


# ------------------------------------------------------------------- scan
def _labels(batch: pa.RecordBatch, fmt: Format, rating_threshold: float) -> np.ndarray:
    column = batch.column(fmt.label)
    if fmt.rating_label:
        ratings = numbers(pc.cast(column, pa.float64()))
        return (ratings >= rating_threshold).astype(np.float32)
    if kernel_kind(fmt.label_pattern, fmt, False) == "bit":
        out = np.empty(len(column), dtype=np.float32)
        bits(*string_buffers(column), out)
        return out
    return numbers(pc.cast(column, pa.float32())).copy()


def _dense(batch: pa.RecordBatch, fmt: Format) -> np.ndarray:
    out = np.zeros((batch.num_rows, len(fmt.dense)), dtype=np.float32)
    fast = kernel_kind(fmt.dense_pattern, fmt, True) == "int"
    for j, name in enumerate(fmt.dense):
        column = batch.column(name)
        if fast:
            log1p_ints(*string_buffers(column), out[:, j])
            continue
        column = pc.if_else(pc.is_in(column, value_set=text_array(fmt.missing, column.type)), "0", column)
        values = numbers(pc.cast(column, pa.float64()))
        out[:, j] = np.log1p(np.maximum(values, 0.0))
    return out


def _part_dir(workdir: Path, part: Part) -> Path:
    return workdir / f"part-{part.index:06d}-{part.key}"


def scan_part(job: tuple) -> dict:
    """Phase 1 for one part; returns its rows, dictionary sizes and bad lines (read back if done before)."""
    part, fmt, workdir, options = job
    done = _part_dir(workdir, part)
    if (done / "part.json").is_file():
        return {**json.loads((done / "part.json").read_text()), "resumed": True}
    dictionaries = [StringDictionary() for _ in fmt.sparse]
    bad_lines: Optional[list] = [] if options.skip_bad_lines else None
    tmp = workdir / f".{done.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    rows = 0
    with contextlib.ExitStack() as files:  # each batch's arrays appended as they are made: raw, row after row
        out = {name: files.enter_context(open(tmp / f"{name}.bin", "wb")) for name in PART_ARRAYS}
        for batch in read_batches(part.path, fmt, part.start, part.end, bad_lines):
            ids = np.empty((batch.num_rows, len(fmt.sparse)), dtype=np.int32)
            for j, (name, dictionary) in enumerate(zip(fmt.sparse, dictionaries)):
                dictionary.encode(*string_buffers(batch.column(name)), ids[:, j])
            arrays = {"ids": ids, "dense": _dense(batch, fmt), "labels": _labels(batch, fmt, options.rating_threshold)}
            if fmt.time_column:
                arrays["times"] = numbers(pc.cast(pc.cast(batch.column(fmt.time_column), pa.string()), pa.int64()))
            for name, array in arrays.items():
                out[name].write(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
            rows += batch.num_rows
    layout = []  # per column: where its offsets, bytes and counts start in dictionaries.bin
    with open(tmp / "dictionaries.bin", "wb") as f:
        for dictionary in dictionaries:
            offsets, data, counts = dictionary.arrays()
            layout.append([f.tell(), f.tell() + offsets.nbytes, len(data), f.tell() + offsets.nbytes + data.nbytes])
            for array in (offsets, data, counts):
                f.write(array.view(np.uint8))
    info = {"rows": rows, "bad_lines": bad_lines or [],
            "distinct": [int(d.size) for d in dictionaries], "layout": layout}
    (tmp / "part.json").write_text(json.dumps(info))
    os.replace(tmp, done)
    return {**info, "resumed": False}


# ------------------------------------------------------------- vocabulary
def _remap_path(workdir: Path, column: int) -> Path:
    """Column ``column``'s table from every part's own ids to the store's, the parts back to back (int32)."""
    return workdir / f"remap{column}.bin"


def vocabulary_task(job: tuple) -> int:
    """Phase 2 for one column: its vocabulary file, and every part's ids -> store ids; returns the cardinality."""
    column, fmt, workdir, parts, infos, min_count = job
    merged = StringDictionary()
    with open(_remap_path(workdir, column), "w+b") as remap:
        for part, info in zip(parts, infos):  # each part's ids into the merged dictionary's, in part order
            n = info["distinct"][column]
            at_offsets, at_data, n_data, at_counts = info["layout"][column]
            ids = np.empty(n, dtype=np.int32)
            with open(_part_dir(workdir, part) / "dictionaries.bin", "rb") as f:
                merged.add(np.fromfile(f, np.int64, n + 1, offset=at_offsets),
                           np.fromfile(f, np.uint8, n_data, offset=at_data - at_offsets - 8 * (n + 1)),
                           np.fromfile(f, np.int64, n, offset=at_counts - at_data - n_data), ids)
            remap.write(ids.view(np.uint8))
        offsets, data, counts = merged.arrays()
        values = pa.LargeStringArray.from_buffers(len(counts), pa.py_buffer(offsets), pa.py_buffer(data))
        missing = numbers(pc.is_in(values, value_set=text_array(fmt.missing, pa.large_string())))
        kept = np.flatnonzero(~missing & (counts >= min_count))
        order = numbers(pc.sort_indices(pa.table({"count": from_numbers(counts[kept]),
                                                  "value": values.take(from_numbers(kept))}),
                                        sort_keys=[("count", "descending"), ("value", "ascending")]))
        store_id = np.full(len(counts), RARE_ID, dtype=np.int32)
        store_id[missing] = MISSING_ID
        store_id[kept[order]] = FIRST_VALUE_ID + np.arange(len(kept), dtype=np.int32)
        total, at = remap.tell(), 0  # then the merged ids to the store's, block by block
        while at < total:
            block = np.fromfile(remap, np.int32, min(WRITE_ROWS, (total - at) // 4), offset=at - remap.tell())
            os.pwrite(remap.fileno(), store_id[block].view(np.uint8), at)
            at += block.nbytes
    _write_vocabulary(workdir / f"vocab{column}.txt", values.take(from_numbers(kept[order])))
    return FIRST_VALUE_ID + len(kept)


# ------------------------------------------------------------------ write
def write_part(job: tuple) -> tuple[int, np.ndarray, np.ndarray]:
    """Phase 3 for one part: its rows of the store's arrays, from row ``first`` on; returns the rows written
    and each table's lowest and highest id among them.

    Written with ``pwrite``: no page faults on the new file's pages, and no
    page of the store counted in this process's resident memory.
    """
    part, workdir, store_dir, first, remap_first, distinct, rows = job
    source = _part_dir(workdir, part)
    n_tables = len(distinct)
    table = np.concatenate([np.fromfile(_remap_path(workdir, j), np.int32, distinct[j], offset=4 * remap_first[j])
                            for j in range(n_tables)] + [np.zeros(0, np.int32)])
    firsts = np.concatenate([[0], np.cumsum(distinct)[:-1]]).astype(np.int64) if n_tables else np.zeros(0, np.int64)
    lowest = np.full(n_tables, np.iinfo(np.int32).max, dtype=np.int64)
    highest = np.full(n_tables, -1, dtype=np.int64)
    with _ArrayFile(store_dir / "sparse.npy") as sparse, open(source / "ids.bin", "rb") as ids:
        for begin in range(0, rows, WRITE_ROWS):
            block = np.fromfile(ids, np.int32, min(WRITE_ROWS, rows - begin) * n_tables).reshape(-1, n_tables)
            out = np.empty_like(block)
            remap_ids(block, table, firsts, out, lowest, highest)
            sparse.write_rows(first + begin, out)
    for name in ("dense", "labels"):  # as they are: copied file to file by the kernel
        with _ArrayFile(store_dir / f"{name}.npy") as target:
            target.copy_rows(first, source / f"{name}.bin")
    return rows, lowest, highest


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask Linux to start writing ``length`` bytes at ``offset`` to disk now, without waiting
    (``sync_file_range``): the store's final sync then finds them written, where otherwise it would write
    the whole store while every other process waits. Elsewhere, nothing."""
    if _SYNC_FILE_RANGE is not None and length > 0:
        _SYNC_FILE_RANGE(fd, ctypes.c_int64(offset), ctypes.c_int64(length), 2)  # SYNC_FILE_RANGE_WRITE


def _sync_file_range():
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return function


_SYNC_FILE_RANGE = _sync_file_range() if sys.platform.startswith("linux") else None


class _ArrayFile:
    """Rows of a C-ordered ``.npy`` file written in place by ``pwrite``."""

    def __init__(self, path: Path):
        with open(path, "rb") as f:
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}[np.lib.format.read_magic(f)]
            shape, _, dtype = read_header(f)
            self.data_start = f.tell()
        self.row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        self.fd = os.open(path, os.O_WRONLY)

    def write_rows(self, first: int, rows: np.ndarray) -> None:
        view = memoryview(np.ascontiguousarray(rows).reshape(-1).view(np.uint8))
        at, done = self.data_start + first * self.row_bytes, 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], at + done)
        _start_writeback(self.fd, at, len(view))

    def copy_rows(self, first: int, path: Path) -> None:
        """The rows in the raw file ``path``, from row ``first`` on."""
        with open(path, "rb") as source:
            size, done = os.fstat(source.fileno()).st_size, 0
            while done < size:
                done += os.copy_file_range(source.fileno(), self.fd, size - done, done,
                                           self.data_start + first * self.row_bytes + done)
        _start_writeback(self.fd, self.data_start + first * self.row_bytes, size)

    def __enter__(self) -> "_ArrayFile":
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


def _time_ordered(parts: list[Part], infos: list[dict], workdir: Path, n_tables: int, writer: StoreWriter) -> None:
    """All rows in timestamp order (stable: file order among equal times), through this process."""
    remaps = [np.fromfile(_remap_path(workdir, j), np.int32) for j in range(n_tables)]
    firsts = _remap_firsts(infos, n_tables)
    sparse, dense, labels, times = [], [], [], []
    for part, remap_first, info in zip(parts, firsts, infos):
        source = _part_dir(workdir, part)
        ids = np.fromfile(source / "ids.bin", np.int32).reshape(info["rows"], n_tables)
        sparse.append(np.stack([remaps[j][remap_first[j] + ids[:, j]] for j in range(n_tables)], axis=1)
                      if n_tables else ids)
        dense.append(np.fromfile(source / "dense.bin", np.float32).reshape(info["rows"], writer.n_dense))
        labels.append(np.fromfile(source / "labels.bin", np.float32))
        times.append(np.fromfile(source / "times.bin", np.int64))
    order = np.argsort(np.concatenate(times), kind="stable")
    writer.append(*(np.concatenate(a)[order] for a in (sparse, dense, labels)))


def _remap_firsts(infos: list[dict], n_tables: int) -> list[list[int]]:
    """Where each part's entries start in each column's remap file."""
    firsts, running = [], [0] * n_tables
    for info in infos:
        firsts.append(list(running))
        running = [r + d for r, d in zip(running, info["distinct"])]
    return firsts


# ------------------------------------------------------------------ driver
def work_dir(out_dir: Path) -> Path:
    """Where finished parts wait for the rest (kept across an interruption)."""
    return out_dir.with_name(f".{out_dir.name}.work")


def preprocess(inputs: Sequence[str | Path], out_dir: str | Path, *, format_name: str,
               min_count: int = 1, rating_threshold: float = 4.0, keep_file_order: bool = False,
               force: bool = False, skip_bad_lines: bool = False, pool: Optional[TaskPool] = None,
               part_bytes: Optional[int] = None, progress: Optional[Callable[..., None]] = None,
               facts: Optional[dict] = None) -> dict:
    """Convert ``inputs`` (in order, e.g. Criteo Terabyte days) into a store at ``out_dir``.

    ``pool`` runs the tasks (default: this process). ``progress(stage, n,
    total)`` is called as parts and columns finish: ``scan`` and ``write``
    count lines (``total`` an estimate), ``vocabulary`` columns. Returns the
    store's meta; ``facts`` (a dict) receives the run's: ``skipped`` (file,
    line) pairs, ``resumed_parts``, ``parts`` and ``seconds``.
    """
    if not inputs:
        raise ValueError("no input files given")
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    if part_bytes is not None and part_bytes < 1:
        raise ValueError(f"part_bytes must be >= 1, got {part_bytes}")
    out_dir = Path(out_dir)
    if out_dir.exists() and not force:
        raise StoreError(f"{out_dir} already exists; pass --force to replace it")
    paths = [Path(p) for p in inputs]
    for path in paths:
        if not path.is_file():
            raise FormatError(f"{path}: no such file")
    formats = [resolve_format(format_name, p) for p in paths]
    fmt = formats[0]
    if any(f.columns != fmt.columns for f in formats):
        raise FormatError(f"inputs mix layouts of format {format_name}: {[str(p) for p in paths]}")
    for path, f in zip(paths, formats):
        check_file(path, f)
    report = progress or (lambda stage, n, total=None: None)
    pool = pool or TaskPool()
    options = ScanOptions(format_name, rating_threshold, skip_bad_lines)
    parts = plan_parts(paths, formats, options, part_bytes or default_part_bytes(paths))
    workdir = work_dir(out_dir)
    if pool.rank == 0:
        _prepare_work_dir(workdir, parts)
    pool.barrier()
    try:
        format_of = {str(p): f for p, f in zip(paths, formats)}
        return _run(parts, format_of, fmt, workdir, out_dir, options, min_count, keep_file_order, force, pool,
                    report, {} if facts is None else facts)
    except (FormatError, StoreError, ValueError):
        pool.stop()  # no worker may write into the work directory once it is gone
        pool.barrier()  # every rank raised the same error; none still reads the work directory
        if pool.rank == 0:
            shutil.rmtree(workdir, ignore_errors=True)  # the input must change before a rerun
        pool.barrier()  # and no rank returns before it is gone
        raise


def _prepare_work_dir(workdir: Path, parts: list[Part]) -> None:
    """Keep the finished parts of this plan; drop anything else (another input's parts, half-written ones)."""
    workdir.mkdir(parents=True, exist_ok=True)
    wanted = {_part_dir(workdir, p).name for p in parts}
    for entry in workdir.iterdir():
        if entry.name not in wanted:
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink()


def _run(parts, format_of, fmt, workdir, out_dir, options, min_count, keep_file_order, force, pool, report,
         facts) -> dict:
    started = time.perf_counter()
    stages: dict[str, float] = {}

    def lap(stage: str) -> None:
        """Seconds since the previous stage ended (the stage breakdown of ``facts``)."""
        stages[stage] = time.perf_counter() - started - sum(stages.values())
    total_bytes = sum(p.size for p in parts)
    seen = {"bytes": 0, "lines": 0}

    def scanned(i: int, info: dict) -> None:
        seen["bytes"] += parts[i].size
        seen["lines"] += info["rows"]
        report("scan", info["rows"], int(seen["lines"] * total_bytes / max(1, seen["bytes"])))

    infos = pool.map(scan_part, [(p, format_of[p.path], workdir, options) for p in parts], scanned)
    lap("scan")
    n_samples = sum(info["rows"] for info in infos)
    if n_samples == 0:
        raise FormatError(f"no data lines left in {', '.join(dict.fromkeys(p.path for p in parts))}"
                          + (" after skipping the bad ones" if options.skip_bad_lines else ""))
    n_tables = len(fmt.sparse)
    # the columns with the most values first, so that the last task to start is a short one
    columns = sorted(range(n_tables), key=lambda j: -sum(info["distinct"][j] for info in infos))
    found = pool.map(vocabulary_task, [(j, fmt, workdir, parts, infos, min_count) for j in columns],
                     lambda i, n: report("vocabulary", 1, n_tables))
    cardinalities = [found[columns.index(j)] for j in range(n_tables)]
    lap("vocabulary")
    time_ordered = bool(fmt.time_column and not keep_file_order)
    source = {"kind": "preprocessed", "format": options.format_name, "files": list(dict.fromkeys(p.path for p in parts)),
              "min_count": min_count, "time_ordered": time_ordered}
    if fmt.rating_label:
        source["rating_threshold"] = options.rating_threshold
    skipped = sorted((p.path, line) for p, info in zip(parts, infos) for line in info["bad_lines"])
    if options.skip_bad_lines:
        source["skipped_lines"] = len(skipped)
    opened: list[StoreWriter] = []
    with contextlib.ExitStack() as stack:
        def open_store() -> str:
            opened.append(stack.enter_context(StoreWriter(
                out_dir, n_samples=n_samples, table_names=list(fmt.sparse), n_dense=len(fmt.dense), source=source,
                force=force)))
            return str(opened[0].tmp_dir)

        store_dir = Path(_on_root(pool, open_store))
        if time_ordered:
            _on_root(pool, lambda: _time_ordered(parts, infos, workdir, n_tables, opened[0]))
            report("write", n_samples, n_samples)
            id_range = None
        else:
            id_range = _write_parts(parts, infos, workdir, store_dir, n_tables, pool, opened, report)
        lap("write")
        meta = _on_root(pool, lambda: _commit(opened[0], workdir, fmt, cardinalities, id_range))
    pool.map(_remove_part, [(workdir, p) for p in parts])  # their files are many: unlink them everywhere
    pool.barrier()
    if pool.rank == 0:
        shutil.rmtree(workdir, ignore_errors=True)
    pool.barrier()  # every rank returns a finished job
    lap("commit")
    facts.update(stages=stages, skipped=skipped, resumed_parts=sum(info["resumed"] for info in infos), parts=len(parts),
                 seconds=time.perf_counter() - started)
    return meta


def _remove_part(job: tuple) -> None:
    workdir, part = job
    shutil.rmtree(_part_dir(workdir, part), ignore_errors=True)


def _on_root(pool: TaskPool, fn: Callable[[], object]) -> object:
    """``fn()`` on rank 0 (what only one rank may do: the store's files); its result, or its error, on every
    rank, so none waits for a rank that failed."""
    result = error = None
    if pool.rank == 0:
        try:
            result = fn()
        except Exception as err:  # raised below, on every rank
            error = err
    result, error = pool.share((result, error))
    if error is not None:
        raise error
    return result


def _write_parts(parts: list[Part], infos: list[dict], workdir: Path, store_dir: Path, n_tables: int,
                 pool: TaskPool, opened: list[StoreWriter], report: Callable) -> tuple[np.ndarray, np.ndarray]:
    """Phase 3 on every part, then rank 0 checksums what they wrote. Returns each table's id range."""
    rows = [info["rows"] for info in infos]
    firsts = np.concatenate([[0], np.cumsum(rows)]).astype(int).tolist()
    results = pool.map(write_part, [(p, workdir, store_dir, f, r, info["distinct"], info["rows"]) for p, f, r, info
                                    in zip(parts, firsts, _remap_firsts(infos, n_tables), infos)],
                       lambda i, result: report("write", result[0], firsts[-1]))
    _on_root(pool, lambda: opened[0].adopt_written())
    return (np.min([r[1] for r in results], axis=0), np.max([r[2] for r in results], axis=0))


def _commit(writer: StoreWriter, workdir: Path, fmt: Format, cardinalities: list[int],
            id_range: Optional[tuple]) -> dict:
    for j, name in enumerate(fmt.sparse):
        shutil.copyfile(workdir / f"vocab{j}.txt", writer.vocab_dir / f"{name}.txt")
    return writer.commit(cardinalities, id_range)


def _write_vocabulary(path: Path, vocabulary: pa.Array) -> None:
    """One value per line; line k (0-based) is id k + FIRST_VALUE_ID."""
    with open(path, "w", encoding="utf-8") as f:
        for begin in range(0, len(vocabulary), 1 << 16):
            f.write("".join(value + "\n" for value in vocabulary.slice(begin, 1 << 16).to_pylist()))


def read_vocabulary(store_dir: str | Path, table: str) -> list[str]:
    """Decoding table of ``table``: entry ``id`` is the original value (None = missing/rare)."""
    path = Path(store_dir) / "vocab" / f"{table}.txt"
    values = path.read_text(encoding="utf-8").split("\n")[:-1]
    return [None, None] + values
