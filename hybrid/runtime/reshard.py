"""Rows of a checkpoint read under another shard plan: elastic resume and export (docs/training.md).

A checkpoint's ``ps-<i>.npy`` files hold PS rank ``i``'s rows in the local
order of the plan that wrote them (its layout is in ``meta.json``). A run
resumed on another number of PS ranks, or another plan, fills each new
shard by asking the old files for exactly the rows the new shard holds, a
chunk at a time: each new PS rank reads only its own rows, and its memory
follows its shard plus one chunk. ``hybrid export`` reads every row the
same way, table after table.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from hybrid.runtime.shard_plan import ShardPlan, ShardPlanError

CHUNK_VALUES = 1 << 22  # values read at a time: the temporaries stay small whatever the shard


def checkpoint_plan(meta: dict, n_rows: int) -> ShardPlan:
    """The shard plan whose layout a checkpoint's PS files are in.

    Checkpoints store it (``shard_layout``); older ones only its
    fingerprint, which is then the default row ranges over the
    checkpoint's PS ranks or cannot be re-sharded.
    """
    if "shard_layout" in meta:
        return ShardPlan.from_dict(meta["shard_layout"])
    n_shards = int(meta.get("config", {}).get("cluster", {}).get("ps", 0))
    default = ShardPlan.contiguous(n_rows, n_shards) if n_shards else None
    if default is None or meta.get("shard_plan", default.fingerprint) != default.fingerprint:
        raise ShardPlanError("this checkpoint does not record its shard plan (written before re-sharding "
                             "existed): resume it on the PS ranks and plan that wrote it")
    return default


class ShardFiles:
    """The PS files of a checkpoint, read by global row whatever their plan."""

    def __init__(self, files: list[Path], plan: ShardPlan, dim: int, dtype: np.dtype):
        if len(files) != plan.n_shards:
            raise ShardPlanError(f"{len(files)} PS files for a plan of {plan.n_shards} shards")
        self.files, self.plan, self.dim, self.dtype = files, plan, dim, np.dtype(dtype)

    def _flat(self, shard: int) -> np.ndarray:
        """Shard ``shard``'s values as one flat array on disk (mapped for this read only)."""
        values = np.load(self.files[shard], mmap_mode="r")
        if values.ndim != 2 or values.shape[1] != self.dim or values.dtype != self.dtype:
            raise ShardPlanError(f"{self.files[shard]}: holds {values.shape} {values.dtype}, expected rows of "
                                 f"{self.dim} {self.dtype}")
        return values.reshape(-1)

    def read(self, rows: np.ndarray) -> np.ndarray:
        """The values of global ``rows`` as ``[len(rows), dim]``, gathered from every piece's file."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.dim), dtype=self.dtype)
        position, shard, local, col_lo, width = self.plan.pieces(rows, self.dim)
        for s in np.unique(shard):
            flat = self._flat(int(s))
            mine = np.flatnonzero(shard == s)
            for w, c in set(zip(width[mine].tolist(), col_lo[mine].tolist())):
                sel = mine[(width[mine] == w) & (col_lo[mine] == c)]
                out[position[sel], c:c + w] = flat.reshape(-1, w)[local[sel]]  # the shard as rows of width w
            del flat  # unmapped: read pages do not stay in this rank's memory
        return out

    def fill(self, shard: np.ndarray, runs, chunk_values: int = CHUNK_VALUES) -> None:
        """Fill a new PS shard in place from its plan's ``runs``, as
        :func:`hybrid.runtime.embedding_init.fill_initial_runs` fills the initial rows."""
        chunk_rows = max(1, chunk_values // self.dim)
        for start, first, count, stride, col_lo, width in runs:
            target = shard.reshape(-1, width) if width else shard
            for done in range(0, count, chunk_rows):
                n = min(chunk_rows, count - done)
                values = self.read(first + stride * (done + np.arange(n, dtype=np.int64)))
                target[start + done:start + done + n] = values[:, col_lo:col_lo + width] if width else values


def saved_shape(meta: dict) -> tuple[int, int]:
    """(workers, PS ranks) of the run that wrote a checkpoint."""
    cluster = meta.get("config", {}).get("cluster", {})
    return int(cluster.get("workers", 0)), int(cluster.get("ps", 0))


def cold_start(meta: dict, workers: int, plan: ShardPlan, cache: dict) -> Optional[str]:
    """Why a resumed run cannot continue the checkpoint's schedule (its scheduler state and caches), or None.

    It continues only on the cluster that wrote it (the same workers, PS
    ranks, layout and caches: ``cache`` is the run's ``cache`` section), and
    not from the last iteration of a run, after which its scheduler planned
    no next batch (a run continued for more iterations). Otherwise the
    scheduler starts cold from the checkpoint's tables, which hold every
    row's latest value (dirty rows were copied to the PS before it was
    written), so BSP trains the same model either way.
    """
    saved_workers, saved_ps = saved_shape(meta)
    if (saved_workers, saved_ps) != (workers, plan.n_shards) or not same_layout(meta, plan):
        return (f"it was written by {saved_workers} workers + {saved_ps} PS; on {workers} + {plan.n_shards} "
                f"(plan {plan.fingerprint}) the PS rows are re-sharded and the scheduler starts cold")
    if meta.get("config", {}).get("cache", cache) != cache:
        return "its cache settings differ from this run's: the scheduler starts cold from its tables"
    if meta.get("ends_run"):
        return "it ended its run: the scheduler starts cold from its tables"
    return None


def files_to_verify(meta: dict, plan: ShardPlan, index: int) -> list[str]:
    """The PS files new PS rank ``index`` checks before anyone reads: its own in the same layout,
    else a share of the old files (every new PS rank may read from each of them)."""
    if same_layout(meta, plan):
        return [f"ps-{index}.npy"]
    return [f"ps-{i}.npy" for i in range(index, saved_shape(meta)[1], plan.n_shards)]


def same_layout(meta: dict, plan: ShardPlan) -> bool:
    """Whether a checkpoint's PS files are already in ``plan``'s layout (each new shard reads its old file)."""
    saved: Optional[str] = meta.get("shard_plan")
    if saved is None:
        saved = ShardPlan.contiguous(plan.n_rows, plan.n_shards).fingerprint
    return saved == plan.fingerprint
