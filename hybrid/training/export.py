"""``hybrid export CHECKPOINT --out FILE``: a checkpoint's tables and MLP as one file (``hybrid.exported``).

The PS files are read under the shard plan that wrote them
(``hybrid.runtime.reshard``), table after table in chunks, into one
``[rows, dim]`` array that ``torch.save`` writes from its own memory: the
process holds the tables once, plus a chunk. Every file is checked
against its checksum first.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm import tqdm

from hybrid import exported, torch_files
from hybrid.data.store import BatchStore
from hybrid.runtime import checkpoint as ckpt
from hybrid.runtime.reshard import CHUNK_VALUES, ShardFiles, checkpoint_plan


def find_checkpoint(path: str | Path) -> ckpt.Checkpoint:
    """The checkpoint at ``path``: a ``step-*`` directory, or the newest complete one under a checkpoint root."""
    path = Path(path)
    if (path / ckpt.META).is_file():
        return ckpt.Checkpoint(path, json.loads((path / ckpt.META).read_text()))
    found = ckpt.CheckpointDir(path).complete() if path.is_dir() else []
    if not found:
        raise ckpt.CheckpointError(f"{path}: neither a checkpoint (no {ckpt.META}) nor a directory holding one")
    return found[0]


def _shapes(checkpoint: ckpt.Checkpoint) -> tuple[np.ndarray, int]:
    """(cardinalities, dense features): from the checkpoint, or (older ones) from the store it was trained on."""
    meta = checkpoint.meta
    if "cardinalities" in meta:
        return np.asarray(meta["cardinalities"], dtype=np.int64), int(meta["n_dense"])
    store = BatchStore(meta["config"]["data"]["path"])
    return store.cardinalities, store.n_dense


def export_checkpoint(source: str | Path, out: str | Path, progress: bool = True,
                      say: Callable[[str], None] = print) -> dict:
    """Write the model of checkpoint ``source`` to ``out``; what was written."""
    checkpoint = find_checkpoint(source)
    meta = checkpoint.meta
    problem = ckpt.verify(checkpoint, sorted(meta.get("files", {})))
    if problem:
        raise ckpt.CheckpointError(f"{checkpoint.path}: {problem}")
    plan = checkpoint_plan(meta, int(meta["rows"]))
    width, dtype = int(meta["dim"]), np.dtype(meta["dtype"])  # stored rows: the embedding, then optimizer state
    dim = int(meta["config"]["model"]["embedding_dim"])
    cardinalities, n_dense = _shapes(checkpoint)
    if int(cardinalities.sum()) != plan.n_rows:
        raise ckpt.CheckpointError(f"{checkpoint.path}: {plan.n_rows} rows, but its tables have "
                                   f"{int(cardinalities.sum())}")
    files = ShardFiles([checkpoint.file(ckpt.shard_name(i)) for i in range(plan.n_shards)], plan, width, dtype)
    table = np.empty((plan.n_rows, dim), dtype=dtype)
    chunk = max(1, CHUNK_VALUES // width)
    with tqdm(total=plan.n_rows, unit="row", unit_scale=True, desc="export", disable=None if progress else True) as bar:
        for begin in range(0, plan.n_rows, chunk):
            end = min(plan.n_rows, begin + chunk)
            table[begin:end] = files.read(np.arange(begin, end, dtype=np.int64))[:, :dim]
            bar.update(end - begin)
    dense = torch_files.load(checkpoint.file("dense.pt"), what="a checkpoint's MLP file",
                             remedy="export an earlier checkpoint",
                             map_location="cpu")["model"]
    offsets = np.concatenate([[0], np.cumsum(cardinalities)[:-1]]).astype(np.int64)
    exported.save(out, config=meta["config"], model_state=dense, embeddings=table, table_offsets=offsets,
                  n_dense=n_dense, step=checkpoint.step)
    written = {"checkpoint": str(checkpoint.path), "step": checkpoint.step, "out": str(out), "rows": plan.n_rows,
               "dim": dim, "tables": len(cardinalities), "bytes": Path(out).stat().st_size}
    say(f"exported {checkpoint.path} (after iteration {checkpoint.step}): {plan.n_rows} rows of {dim} in "
        f"{len(cardinalities)} tables and the MLP -> {out} ({written['bytes'] / 2**20:.1f} MB)")
    return written
