"""HET: a staleness-bounded cache, pushed and refreshed by per-row clocks (docs/design.md section 7).

Samples go to workers in contiguous shards. The cluster state decides every
event (which cached rows are checked, which are fetched again, which updates
are pushed and when); this executes one worker's share of them against its
cache and the store:

- ``pending`` holds, per cache slot, the updates the PS has not seen (zero
  when there are none). A row fetched again keeps them: the fetched value
  plus ``pending`` is what HET's "push, then fetch" would read.
- The updates of an evicted row are copied out when its slot is taken, and
  pushed with the iteration's other pushes.
- Every push is an ``Accumulate`` of the pending delta plus an addition of
  its update count to the row's version (the PS keeps a version per row).
  Pushes start after the allreduce, as every write does, so all reads of an
  iteration see the versions (and rows) its start had (docs/design.md
  section 11, ordering rule 1).
- A version read that differs from the state's is a bug, and stops the run.
- With a 16-bit wire (docs/design.md section 14) a push adds the rounded
  delta at the PS, and the pushing worker's copy takes the rounded delta
  too, in place of its own: its copy goes on from what the PS received.

With ``scheduler.staleness=0`` this is BSP. Its workers hold updates the PS
has not seen, so it refuses checkpoints and mid-run evaluations.
"""
from __future__ import annotations

import numpy as np

from hybrid.config import Mode
from hybrid.modes.base import TrainingMode, WorkerContext
from hybrid.scheduling.plans import BatchPlan, StaleShare, WorkerPlan
from hybrid.scheduling.policy import Allocation, SchedulePolicy, Sync


class Het(TrainingMode):
    """HET's clocks over contiguous shards; a worker's unpushed updates beside its cache (rows by slot)."""

    name = Mode.het
    schedule = SchedulePolicy(Allocation.contiguous, Sync.het_clocks)
    checkpoints = False
    rowwise_optimizers = False
    store_versions = True

    def __init__(self, context: WorkerContext):
        super().__init__(context)
        self.pending = np.zeros_like(self.cache)
        self._evicted: tuple = ()  # (rows, deltas, counts) copied out in this iteration's reads
        self._versions = np.zeros(0, dtype=np.int64)  # this iteration's version reads, once completed

    def begin(self, plan: BatchPlan) -> list:
        """Copy out the evicted rows' updates before fetched rows land in their slots; start the version reads."""
        share = plan.work.stale
        slots = share.evicted.slots
        self._evicted = (share.evicted.rows, self.pending[slots], share.evicted_counts)
        self.pending[slots] = 0
        self._versions = np.empty(len(share.checks), dtype=np.int64)
        return [self.table.read_versions(share.checks, self._versions)]

    def after_reads(self, work: WorkerPlan) -> None:
        """Check the versions read against the state's; fetched rows keep their own unpushed updates."""
        self._verify(work.stale, self._versions)
        slots = np.concatenate([work.pull.slots, work.prefetch.slots])
        self.cache[slots] += self.pending[slots]

    def _verify(self, share: StaleShare, versions: np.ndarray) -> None:
        """The versions read must be the ones the cluster state computed (else state and PS disagree)."""
        bad = np.flatnonzero(versions != share.expected)
        if len(bad):
            raise RuntimeError(f"worker {self.roles.worker}: {len(bad)} PS versions differ from the cluster state's, "
                               f"e.g. row {share.checks[bad[0]]}: {versions[bad[0]]} at the PS, "
                               f"{share.expected[bad[0]]} expected")

    def update(self, work: WorkerPlan, gradients: np.ndarray) -> list:
        """Apply every trained row's update to the cache and to its pending delta; start this iteration's pushes."""
        share = work.stale
        deltas = -self.embedding_lr * gradients
        self.cache[work.slots] += deltas
        self.pending[work.slots] += deltas
        rows, slots = work.rows[share.push], work.slots[share.push]
        pushed = self.pending[slots]
        wire = self.table.wire
        if wire.sixteen_bit:
            sent = wire.round(pushed)
            self.cache[slots] += sent - pushed
            pushed = sent
        evicted_rows, evicted_deltas, evicted_counts = self._evicted
        handles = [self.table.accumulate(rows, pushed),
                   self.table.add_versions(rows, share.push_counts),
                   self.table.accumulate(evicted_rows, evicted_deltas),
                   self.table.add_versions(evicted_rows, evicted_counts)]
        self.pending[slots] = 0  # the operations copied their values when they started
        self._evicted = ()
        return handles

    def flush(self) -> None:
        """Push the unpushed updates of every row this worker caches (the end of training) and wait for them.

        At full precision whatever the wire: training has ended, and the PS gets every update as it is.
        """
        workers, rows, slots, counts = self.scheduler.state.flush_pending()
        mine = workers == self.roles.worker
        rows, slots, counts = rows[mine], slots[mine], counts[mine]
        self.table.complete(self.table.accumulate(rows, self.pending[slots], exact=True),
                            self.table.add_versions(rows, counts))
        self.pending[slots] = 0
