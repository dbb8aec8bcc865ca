"""Vanilla BSP with worker caches: every trained row synchronized each iteration (docs/design.md section 3).

Samples go to workers at random (seeded, balanced). The cluster state decides
every event; this module applies one worker's updates as the state machine
says, the rule herald and its ablations share:

- a row only this worker trains gets local SGD in its cache;
- a row several workers train gets each trainer's ``-lr * grad`` added at the
  PS (``Accumulate``);
- full-set synchronization (this mode) writes every row it trained alone
  back to the PS after its update (``Put``); on-demand plans (herald) write
  only the dirty rows another worker needs next (plan pushes).

With ``train.deterministic`` the shared rows are added turn by turn in worker
order, so every run sums each row in the same order.

With row-wise Adagrad (``train.embedding_optimizer``) the update is not
linear in the gradient, so a shared row cannot be updated as the sum of its
trainers' updates: its trainers first sum their gradients with one allreduce
over the iteration's shared rows (the plan's ``shared``, the same on every
worker), then each applies the same update to its copy of the row and its
accumulator and writes the same bytes to the PS (``replace``). Rows trained
alone are updated in the cache as with SGD. The rows moved are SGD's; the
allreduce is counted apart (``shared_allreduce``).
"""
from __future__ import annotations

import numpy as np

from hybrid._ext import row_kernels
from hybrid.config import EmbeddingOptimizer, Mode
from hybrid.embedding_optimizer import updated
from hybrid.modes.base import TrainingMode
from hybrid.scheduling.plans import WorkerPlan
from hybrid.scheduling.policy import Allocation, SchedulePolicy, Sync


class Vanilla(TrainingMode):
    """BSP with caches, full-set synchronization, random allocation."""

    name = Mode.vanilla
    schedule = SchedulePolicy(Allocation.balanced, Sync.full_set)

    def reduce(self, work: WorkerPlan, gradients: np.ndarray) -> np.ndarray:
        """Row-wise Adagrad: the shared rows' gradients summed over every worker (one allreduce); SGD: as they are."""
        if work.shared is None or not len(work.shared):
            return gradients
        shared = work.accumulate
        positions = np.searchsorted(work.shared, work.rows[shared])
        trains_shared = np.isin(work.rows, work.shared, assume_unique=True)
        if len(positions) != trains_shared.sum() or not np.array_equal(work.shared[positions], work.rows[shared]):
            raise RuntimeError(f"worker {self.roles.worker}: the rows it accumulates are not the rows several "
                               f"workers train; the plan and the cluster state disagree")
        import torch  # workers only: importing a mode stays light (the simulator's)

        summed = np.zeros((len(work.shared), gradients.shape[1]), dtype=gradients.dtype)
        summed[positions] = gradients[shared]
        summed = self.context.hvd.allreduce(torch.from_numpy(summed), op=self.context.hvd.Sum,
                                            name="shared_rows").numpy()
        gradients = gradients.copy()
        gradients[shared] = summed[positions]
        return gradients

    def update(self, work: WorkerPlan, gradients: np.ndarray) -> list:
        """Local SGD on rows trained alone; PS writes of full-set and plan-pushed rows; shared rows accumulated."""
        if self.config.train.embedding_optimizer is not EmbeddingOptimizer.sgd:
            return self._update_rowwise(work, gradients)
        lr = self.embedding_lr
        gradients = np.ascontiguousarray(gradients)
        slots = np.asarray(work.slots, dtype=np.int32)
        full, shared = work.full_set, work.accumulate
        for positions in (work.local, full):  # one pass each, rounding as NumPy's cache[...] -= lr * g[...]
            if len(positions):
                row_kernels.sgd_rows(self.cache, slots, np.asarray(positions, dtype=np.int32), gradients, lr)
        # most of herald's iterations have no full-set rows, plan pushes or shared rows on a worker: no call
        # (nor its arrays) for those, each a few microseconds of the loop's own (docs/benchmarks.md, issue 54)
        writes = []
        if len(full):
            writes.append(self._send(work.rows[full], slots[full]))
        if len(work.plan_push):
            writes.append(self._send(work.plan_push.rows, work.plan_push.slots))
        if self.config.train.deterministic:  # every worker takes every turn, with shared rows or without
            return writes + [self._accumulate_in_worker_order(work.rows[shared], -lr * gradients[shared], work)]
        if len(shared):
            writes.append(self.table.accumulate(work.rows[shared], -lr * gradients[shared]))
        return writes

    def _send(self, rows: np.ndarray, slots: np.ndarray):
        """Start writing cached rows to the PS; with a 16-bit wire the cached copies become what the PS gets.

        The rows stay fresh in this cache, so the copy here and the one at the
        PS must stay equal: both are the rounded row (docs/design.md section 14).
        """
        values = self.cache[slots]
        if self.table.wire.sixteen_bit:
            self.table.wire.round_(values)
            self.cache[slots] = values
        return self.table.put(rows, values)

    def _update_rowwise(self, work: WorkerPlan, gradients: np.ndarray) -> list:
        """Row-wise Adagrad: every row updated in the cache from its summed gradient (:meth:`reduce`); full-set and
        plan-pushed rows written to the PS as with SGD, shared rows written by each trainer alike."""
        slots = work.slots
        self.cache[slots] = updated(self.cache[slots], gradients, self.config, self.embedding_lr)
        shared = work.accumulate
        return [self.table.put(work.rows[work.full_set], self.cache[slots[work.full_set]]),
                self.table.put(work.plan_push.rows, self.cache[work.plan_push.slots]),
                self.table.replace(work.rows[shared], self.cache[slots[shared]])]

    def _accumulate_in_worker_order(self, rows: np.ndarray, deltas: np.ndarray, work: WorkerPlan):
        """Add shared rows' deltas turn by turn, so each row's sum has one order: the workers'.

        Concurrent Accumulates to one row land in arrival order, and float
        addition is not associative, so two runs (or a run and its resume)
        would differ in the last bits (~1e-16). Turn ``k`` completes at the PS
        before any worker starts turn ``k + 1``: ``accumulate_rounds - 1``
        extra flushes and barriers per iteration. Returns the last turn's handle.
        """
        turns = work.accumulate_turns
        for turn in range(work.accumulate_rounds - 1):
            mine = turns == turn
            self.table.complete(self.table.accumulate(rows[mine], deltas[mine]))
            self.roles.worker_barrier()
        last = turns == max(work.accumulate_rounds - 1, 0)
        return self.table.accumulate(rows[last], deltas[last])

    def flush(self) -> None:
        """Write this worker's dirty rows to the PS (the cluster state says which, and they become clean).

        At full precision whatever the wire: training has ended, and the PS gets the latest model as it is.
        """
        workers, rows, slots = self.scheduler.state.flush_dirty()
        mine = workers == self.roles.worker
        self.table.put(rows[mine], self.cache[slots[mine]], exact=True).wait()
