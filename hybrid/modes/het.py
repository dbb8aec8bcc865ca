"""HET's side of a worker's iteration: unpushed updates, version reads, pushes (docs/design.md section 7).

The cluster state decides every event (which cached rows are checked, which
are fetched again, which updates are pushed and when); this executes one
worker's share of them against its cache and the store:

- ``pending`` holds, per cache slot, the updates the PS has not seen (zero
  when there are none). A row fetched again keeps them: the fetched value
  plus ``pending`` is what HET's "push, then fetch" would read.
- The updates of an evicted row are copied out when its slot is taken, and
  pushed with the iteration's other pushes.
- Every push is an ``Accumulate`` of the pending delta plus an addition of
  its update count to the row's version. Pushes start after the allreduce,
  as every write does, so all reads of an iteration see the versions (and
  rows) its start had (docs/design.md section 11, ordering rule 1).
- A version read that differs from the state's is a bug, and stops the run.
"""
from __future__ import annotations

import numpy as np

from hybrid.runtime.rma_store import EmbeddingStore, Handle
from hybrid.scheduling.scheduler import StaleShare, WorkerPlan


class StaleCache:
    """A worker's unpushed updates beside its cache (rows by slot)."""

    def __init__(self, store: EmbeddingStore, cache: np.ndarray, worker: int):
        self.store, self.cache, self.worker = store, cache, worker
        self.pending = np.zeros_like(cache)
        self._evicted: tuple = ()  # (rows, deltas, counts) copied out in this iteration's reads

    def start_reads(self, share: StaleShare) -> tuple[Handle, np.ndarray]:
        """Copy out the evicted rows' updates before fetched rows land in their slots; start the version reads."""
        slots = share.evicted.slots
        self._evicted = (share.evicted.rows, self.pending[slots], share.evicted_counts)
        self.pending[slots] = 0
        versions = np.empty(len(share.checks), dtype=np.int64)
        return self.store.read_versions(share.checks, versions), versions

    def place(self, slots: np.ndarray) -> None:
        """Fetched rows (completed into their slots) keep their own unpushed updates."""
        self.cache[slots] += self.pending[slots]

    def verify(self, share: StaleShare, versions: np.ndarray) -> None:
        """The versions read must be the ones the cluster state computed (else state and PS disagree)."""
        bad = np.flatnonzero(versions != share.expected)
        if len(bad):
            raise RuntimeError(f"worker {self.worker}: {len(bad)} PS versions differ from the cluster state's, e.g. "
                               f"row {share.checks[bad[0]]}: {versions[bad[0]]} at the PS, "
                               f"{share.expected[bad[0]]} expected")

    def update(self, work: WorkerPlan, gradients: np.ndarray, lr: float) -> list[Handle]:
        """Apply every trained row's update to the cache and to its pending delta; start this iteration's pushes."""
        share = work.stale
        deltas = -lr * gradients
        self.cache[work.slots] += deltas
        self.pending[work.slots] += deltas
        rows, slots = work.rows[share.push], work.slots[share.push]
        evicted_rows, evicted_deltas, evicted_counts = self._evicted
        handles = [self.store.accumulate(rows, self.pending[slots]),
                   self.store.add_versions(rows, share.push_counts),
                   self.store.accumulate(evicted_rows, evicted_deltas),
                   self.store.add_versions(evicted_rows, evicted_counts)]
        self.pending[slots] = 0  # the operations copied their values when they started
        self._evicted = ()
        return handles

    def flush(self, rows: np.ndarray, slots: np.ndarray, counts: np.ndarray) -> None:
        """Push the given cached rows' unpushed updates (the end of training) and wait for them."""
        self.store.complete(self.store.accumulate(rows, self.pending[slots]), self.store.add_versions(rows, counts))
        self.pending[slots] = 0
