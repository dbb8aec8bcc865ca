"""Checkpoints on disk: layout, atomic commit, checksums, and choosing one to resume from.

docs/design.md section 13. A checkpoint is a directory ``step-<t>`` (the last
trained iteration ``t``) under the run's checkpoint directory::

    meta.json       format, step, the config and data it belongs to, each file's size and SHA-256
    dense.pt        the MLP and its optimizer (worker 0; loaded with torch.load(weights_only=True))
    scheduler.npz   the scheduler's state after iteration t (worker 0; NumPy, no pickle)
    ps-<i>.npy      the rows of PS rank i (written by that rank, streamed in chunks)

Every rank writes its files into ``.tmp-step-<t>``; worker 0 then writes
``meta.json`` and renames the directory, so a directory named ``step-*``
with a ``meta.json`` is complete, and a crash mid-write leaves only a
temporary directory (removed by the next checkpoint). This module does the
file work; which rank writes what, and when, is the trainer's (section 13).
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from hybrid.config import RESHAPE_KEYS, Config, flatten

FORMAT = 1
META = "meta.json"
CHUNK_BYTES = 64 << 20  # rows are written and read this much at a time: never a whole table in memory


class CheckpointError(ValueError):
    """A checkpoint cannot be written, or none can be resumed from."""


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint directory and its metadata."""

    path: Path
    meta: dict

    @property
    def step(self) -> int:
        """The last iteration it includes."""
        return int(self.meta["step"])

    def file(self, name: str) -> Path:
        return self.path / name


def shard_name(index: int) -> str:
    return f"ps-{index}.npy"


class CheckpointDir:
    """The checkpoints of one run: staging, commit, pruning to the newest ``keep``, listing."""

    def __init__(self, root: Path | str, keep: int = 2):
        self.root, self.keep = Path(root), keep

    def staging_path(self, step: int) -> Path:
        """Where every rank writes its files of the checkpoint of ``step`` before the commit."""
        return self.root / f".tmp-step-{step:09d}"

    def staging(self, step: int) -> Path:
        """An empty :meth:`staging_path`; leftovers of crashed attempts (any step) are removed.

        One run writes into a checkpoint directory at a time, so any other
        staging directory is a failed attempt's, taking space a disk may lack.
        """
        path = self.staging_path(step)
        try:
            for leftover in self.root.glob(".tmp-step-*") if self.root.is_dir() else ():
                shutil.rmtree(leftover)
            path.mkdir(parents=True)
        except OSError as err:
            raise CheckpointError(f"cannot create checkpoint directory {path}: {err}; "
                                  f"set train.checkpoint_dir to a writable directory") from None
        return path

    def commit(self, staging: Path, meta: dict) -> Checkpoint:
        """Write ``meta.json`` last and rename ``staging`` to ``step-<t>``; then keep the newest ``keep`` of
        this run (``meta["run"]``): another run's checkpoints are never removed here."""
        final = self.root / f"step-{int(meta['step']):09d}"
        with writing(staging / META):
            _write_synced(staging / META, (json.dumps(meta, indent=2) + "\n").encode())
        replaced = self.root / f".old-{final.name}"
        if final.exists():  # the same step saved again (e.g. a resumed run stopped at once)
            os.rename(final, replaced)  # not deleted before the new one is in place
        os.rename(staging, final)
        _sync_directory(self.root)
        shutil.rmtree(replaced, ignore_errors=True)
        for old in [c for c in self.complete() if c.meta.get("run") == meta.get("run")][self.keep:]:
            shutil.rmtree(old.path, ignore_errors=True)
        return Checkpoint(final, meta)

    def complete(self) -> list[Checkpoint]:
        """Complete checkpoints, newest first (directories with a readable ``meta.json`` of this format)."""
        found = []
        for path in self.root.glob("step-*") if self.root.is_dir() else ():
            try:
                meta = json.loads((path / META).read_text())
            except (OSError, ValueError):
                continue
            if isinstance(meta, dict) and meta.get("format") == FORMAT and isinstance(meta.get("step"), int):
                found.append(Checkpoint(path, meta))
        return sorted(found, key=lambda c: c.step, reverse=True)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _sync_directory(path: Path) -> None:
    """Make a rename durable: fsync the directory holding it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_record(path: Path) -> dict:
    """Size and SHA-256 of a written file (read in chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK_BYTES), b""):
            digest.update(block)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def room_problem(root: Path, need_bytes: int) -> Optional[str]:
    """Why checkpoints of ``need_bytes`` cannot be written under ``root``, or None; creates nothing.

    Asked at start-up, so that a read-only or full disk stops the run in
    seconds rather than at its first checkpoint, hours later.
    """
    existing = Path(root)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):  # also false on a read-only filesystem, even for root
        return f"{existing} is not writable"
    free = shutil.disk_usage(existing).free
    if free < need_bytes:
        return f"{existing} has {free / 2**20:.1f} MB free, and a checkpoint takes at least {need_bytes / 2**20:.1f} MB"
    return None


@contextlib.contextmanager
def writing(path: Path):
    """A checkpoint file's write: on a full or read-only disk, remove the partial file and say what to do.

    The previous checkpoints stay as they are (a new one is committed only
    once complete), so the message can promise that.
    """
    try:
        yield
    except (OSError, RuntimeError) as err:  # torch.save reports a failed write as a RuntimeError
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err).splitlines()[0]
        raise CheckpointError(f"cannot write {path}: {reason}; the previous checkpoints are intact: free space "
                              f"or set train.checkpoint_dir elsewhere (and copy them there), then --resume") from None


def write_rows(path: Path, rows: np.ndarray) -> dict:
    """Write ``rows`` (a 2-D array, e.g. a PS shard in window memory) as ``.npy`` in chunks; its record.

    Each chunk is hashed in a second thread while it is written (both
    release the GIL), so a shard is read from memory once, never copied
    whole, and hashing adds no time to the write.
    """
    digest = hashlib.sha256()
    header = {"descr": np.lib.format.dtype_to_descr(rows.dtype), "fortran_order": False, "shape": rows.shape}
    per_chunk = max(1, CHUNK_BYTES // max(1, rows.strides[0]))
    prefix = io.BytesIO()
    np.lib.format.write_array_header_1_0(prefix, header)
    with writing(path), open(path, "wb") as f, ThreadPoolExecutor(max_workers=1) as hasher:
        f.write(prefix.getvalue())
        digest.update(prefix.getvalue())
        for begin in range(0, len(rows), per_chunk):
            block = np.ascontiguousarray(rows[begin:begin + per_chunk]).data
            hashed = hasher.submit(digest.update, block)
            f.write(block)
            hashed.result()
        f.flush()
        os.fsync(f.fileno())
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def read_rows_into(path: Path, out: np.ndarray) -> None:
    """Read the rows of a ``.npy`` written by :func:`write_rows` straight into ``out``, a chunk at a time.

    Plain reads into ``out`` (e.g. the PS window), not a memory map: mapped
    file pages would count in the rank's resident memory next to the shard.
    """
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read_header is None:
                raise ValueError(f"format version {version}")
            shape, fortran, dtype = read_header(f)
        except ValueError as err:
            raise CheckpointError(f"{path}: not a .npy file of rows ({err})") from None
        if fortran or tuple(shape) != out.shape or dtype != out.dtype:
            raise CheckpointError(f"{path}: holds {tuple(shape)} {dtype}, expected {out.shape} {out.dtype}")
        if not out.flags.c_contiguous:
            raise ValueError("read_rows_into needs a C-contiguous array to read into")
        flat = out.reshape(-1).view(np.uint8)
        for begin in range(0, len(flat), CHUNK_BYTES):
            view = memoryview(flat[begin:begin + CHUNK_BYTES])
            if f.readinto(view) != len(view):
                raise CheckpointError(f"{path}: ends early (truncated)")


def write_arrays(path: Path, arrays: dict) -> dict:
    """Save named arrays as ``.npz`` (no pickled objects); its record."""
    with writing(path), open(path, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())
    return file_record(path)


def read_arrays(path: Path) -> dict:
    """Named arrays of :func:`write_arrays`, refusing anything that would need unpickling."""
    with np.load(path, allow_pickle=False) as saved:
        return {name: saved[name] for name in saved.files}


def verify(checkpoint: Checkpoint, names: list[str]) -> Optional[str]:
    """Why the named files of ``checkpoint`` cannot be used (missing, truncated, changed), or None."""
    records = checkpoint.meta.get("files", {})
    for name in names:
        path = checkpoint.file(name)
        if name not in records:
            return f"{name} is not listed in its {META}"
        if not path.is_file():
            return f"{name} is missing"
        expected = records[name]
        size = path.stat().st_size
        if size != expected.get("bytes"):
            return f"{name} has {size} bytes, {expected.get('bytes')} were written (truncated or replaced)"
        if file_record(path)["sha256"] != expected.get("sha256"):
            return f"{name} does not match its SHA-256 (corrupted)"
    return None


def mismatch(checkpoint: Checkpoint, training: dict, fingerprint: str) -> Optional[str]:
    """Why ``checkpoint`` belongs to another run (config keys or data that differ), or None.

    The cluster's shape and the run's length may change (``RESHAPE_KEYS``)
    as long as the global batch stays: it fixes every iteration's samples.
    Keys added to the config after the checkpoint was written count as
    their defaults.
    """
    meta = checkpoint.meta
    if meta.get("data_fingerprint") != fingerprint:
        return (f"it was written for data with fingerprint {meta.get('data_fingerprint')}, this store has "
                f"{fingerprint}")
    # a key the checkpoint's version did not have yet had its default value then
    saved, now = {**flatten(Config().training_dict()), **flatten(meta.get("config", {}))}, flatten(training)
    differing = sorted(key for key in now.keys() | saved.keys()
                       if key not in RESHAPE_KEYS and now.get(key) != saved.get(key))
    if differing:
        shown = ", ".join(f"{k} (checkpoint {saved.get(k)!r}, now {now.get(k)!r})" for k in differing[:5])
        return f"it was written by another config: {shown}"
    return _global_batch_mismatch(saved, now)


def _global_batch_mismatch(saved: dict, now: dict) -> Optional[str]:
    """Why the resumed run's global batch differs from the checkpoint's, and the values that keep it."""
    batch, workers = saved["cluster.workers"] * saved["train.batch_per_worker"], now["cluster.workers"]
    if workers * now["train.batch_per_worker"] == batch:
        return None
    keep = (f"train.batch_per_worker={batch // workers} keeps it on {workers} workers" if batch % workers == 0
            else f"no train.batch_per_worker keeps it on {workers} workers; use a number of workers dividing {batch}")
    return (f"its global batch is {batch} samples ({saved['cluster.workers']} workers x "
            f"{saved['train.batch_per_worker']}), this run's {workers * now['train.batch_per_worker']}: {keep}")


def metadata(*, step: int, training: dict, fingerprint: str, files: dict, extra: dict) -> dict:
    """The ``meta.json`` of a checkpoint of iteration ``step``."""
    return {"format": FORMAT, "step": step, "next_step": step + 1,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "data_fingerprint": fingerprint,
            "config": training, "files": files, **extra}
