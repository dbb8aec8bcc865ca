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
"""
from __future__ import annotations

import numpy as np

from hybrid.config import Mode
from hybrid.modes.base import TrainingMode
from hybrid.scheduling.plans import WorkerPlan
from hybrid.scheduling.policy import Allocation, SchedulePolicy, Sync


class Vanilla(TrainingMode):
    """BSP with caches, full-set synchronization, random allocation."""

    name = Mode.vanilla
    schedule = SchedulePolicy(Allocation.random, Sync.full_set)

    def update(self, work: WorkerPlan, gradients: np.ndarray) -> list:
        """Local SGD on rows trained alone; PS writes of full-set and plan-pushed rows; shared rows accumulated."""
        lr = self.config.train.embedding_lr
        local = work.local
        self.cache[work.slots[local]] -= lr * gradients[local]
        full = work.full_set
        full_slots = work.slots[full]
        self.cache[full_slots] -= lr * gradients[full]
        writes = [self.table.put(work.rows[full], self.cache[full_slots]),
                  self.table.put(work.plan_push.rows, self.cache[work.plan_push.slots])]
        shared = work.accumulate
        rows, deltas = work.rows[shared], -lr * gradients[shared]
        if self.config.train.deterministic:
            return writes + [self._accumulate_in_worker_order(rows, deltas, work)]
        return writes + [self.table.accumulate(rows, deltas)]

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
        """Write this worker's dirty rows to the PS (the cluster state says which, and they become clean)."""
        workers, rows, slots = self.scheduler.state.flush_dirty()
        mine = workers == self.roles.worker
        self.table.put(rows[mine], self.cache[slots[mine]]).wait()
