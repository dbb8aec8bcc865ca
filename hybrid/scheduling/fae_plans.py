"""FAE's plans: cold strips through the cluster state, hot strips on replicated rows (docs/design.md section 7).

A cold strip runs as vanilla BSP with caches: the full-set cluster state of
the mode's :class:`~hybrid.scheduling.scheduler.Scheduler`, one ``plans`` stream per
strip (full-set synchronization leaves no row dirty, so a strip's last plan
needs no look-ahead into the next strip). A hot iteration touches only hot
rows, which every worker holds in a replica: no PS traffic, the union of
the batch's hot rows is allreduced (``hot_allreduce``). Between strips the
replicas and the PS are synchronized, and counted:

- before a pair of strips (after the first) whose previous strip was hot,
  worker 0 writes the replica to the PS (``hot_push``, every hot row) and
  the caches' copies of hot rows stop being fresh; the held-out loss of the
  pair that ended is measured then, when the PS holds the whole model;
- before a hot strip that follows a cold one (or starts the run), every
  worker reads the hot rows into its replica (``hot_pull``, per worker).

Every rank builds the same plans from the same batches (section 3).
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

import numpy as np

from hybrid.config import Config
from hybrid.scheduling.event_kinds import KINDS
from hybrid.scheduling.fae_calibration import stored_calibration
from hybrid.scheduling.plans import BatchPlan, HotShare, PeerTransfer, Transfer, WorkerPlan
from hybrid.scheduling.policy import SchedulerError
from hybrid.scheduling.scheduler import Scheduler


@dataclass(frozen=True)
class FaeStep:
    """What the runtime does before an iteration of FAE's order, and where the iteration sits in it."""

    kind: str  # "hot" or "cold"
    pair: int
    push_replicas: bool  # worker 0 writes the replica to the PS first
    observe: Optional[int]  # the pair whose held-out loss is measured then (after the push), or None
    pull_replicas: bool  # every worker reads the hot rows into its replica (after the observation)


def calibration_for(config: Config, store, say=print):
    """The stored FAE calibration of ``store`` (the training split) for ``config``."""
    row_bytes = config.model.embedding_dim * np.dtype(config.model.precision.value).itemsize
    return stored_calibration(store, row_bytes=row_bytes, budget_bytes=int(config.fae.budget_mb * 2**20),
                              sample_fraction=config.fae.sample_fraction, seed=config.seed,
                              small_table_bytes=int(config.fae.small_table_kb * 1024), say=say)


class FaeScheduler:
    """Plans over batches tagged with their strip (``GlobalBatch.strip``, from ``hybrid.scheduling.fae_order``)."""

    takes_batches = True  # the plan producer hands it whole batches, not their ids

    def __init__(self, cold: Scheduler, hot_rows: np.ndarray):
        self.cold, self.state = cold, cold.state
        self.hot_rows = np.ascontiguousarray(hot_rows, dtype=np.int64)
        if len(self.hot_rows) and (np.diff(self.hot_rows) <= 0).any():
            raise ValueError("hot_rows must be sorted and distinct")
        self._empty = _HotWork()

    @property
    def policy(self):
        """The allocation policy within each hot or cold batch (seeded random)."""
        return self.cold.policy

    @property
    def snapshot_worker(self) -> Optional[int]:
        """Debug (``train.verify_cache``): the cold strips' plans carry this worker's view of the state."""
        return self.cold.snapshot_worker

    @snapshot_worker.setter
    def snapshot_worker(self, worker: Optional[int]) -> None:
        self.cold.snapshot_worker = worker

    @property
    def beside_a_loop(self) -> bool:
        """Whether the cold strips' scheduler releases the interpreter lock between steps (the plan producer's)."""
        return self.cold.beside_a_loop

    @beside_a_loop.setter
    def beside_a_loop(self, beside: bool) -> None:
        self.cold.beside_a_loop = beside

    def save_arrays(self) -> dict:
        raise SchedulerError("FAE runs are not checkpointed (docs/design.md section 7)")

    def plans(self, batches: Iterable, resume: Optional[dict] = None, start_step: int = 0) -> Iterator[BatchPlan]:
        """One plan per batch, in order; each batch carries its ``strip``."""
        if resume is not None or start_step:
            raise SchedulerError("FAE runs are not resumed (docs/design.md section 7)")
        iterator = iter(batches)
        batch = next(iterator, None)
        step, previous, previous_pair = 0, None, None  # the kind and pair of the last strip run
        while batch is not None:
            strip = batch.strip
            starts_pair = previous_pair is not None and strip.pair != previous_pair
            fae = FaeStep(kind=strip.kind, pair=strip.pair,
                          push_replicas=starts_pair and previous == "hot",
                          observe=strip.pair - 1 if starts_pair else None,
                          pull_replicas=strip.kind == "hot" and previous != "hot")
            if fae.push_replicas:
                self.state.reset_to_ps(self.hot_rows)
            rest: list = []
            members = _strip_members(batch, iterator, rest)
            if strip.kind == "cold":
                plans = self.cold.plans((b.sparse for b in members), start_step=step)
            else:
                # enumerate() is evaluated now, with this strip's first step (the loop below advances ``step``)
                plans = (self._hot_plan(b, at) for at, b in enumerate(members, start=step))
            for plan in plans:
                plan.fae = fae
                plan.counts["hot_push"] = len(self.hot_rows) if fae.push_replicas else 0
                plan.counts["hot_pull"] = len(self.hot_rows) * self.state.n_workers if fae.pull_replicas else 0
                plan.per_worker = self._switch_transmissions(plan, fae)
                yield plan
                fae = FaeStep(strip.kind, strip.pair, False, None, False)
                step += 1
            previous, previous_pair = strip.kind, strip.pair
            batch = rest[0] if rest else None

    def _switch_transmissions(self, plan: BatchPlan, fae) -> np.ndarray:
        """Per worker: the plan's own, plus the replica write (worker 0) and reads (every worker) of a switch."""
        per_worker = np.zeros(self.state.n_workers, np.int64) if plan.per_worker is None else plan.per_worker
        per_worker[0] += len(self.hot_rows) if fae.push_replicas else 0
        return per_worker + (len(self.hot_rows) if fae.pull_replicas else 0)

    def _hot_plan(self, batch, step: int) -> BatchPlan:
        """A hot iteration: balanced random allocation, rows from the replicas, their union allreduced."""
        start = time.perf_counter()
        rows = self.cold.global_rows(batch.sparse)
        alloc = self.cold.policy.allocate(rows, step)
        union = np.unique(rows)
        union_slots = self._replica_slots(union)
        counts = dict.fromkeys(KINDS, 0) | {"hot_allreduce": len(union)}
        digest = hashlib.sha256(alloc.tobytes() + union_slots.tobytes()).hexdigest()[:16]
        work = None
        if self.state.focus >= 0:
            samples = np.flatnonzero(alloc == self.state.focus)
            mine, inverse = np.unique(rows[samples], return_inverse=True)
            work = self._empty.plan(samples=samples, index=inverse.reshape(len(samples), -1).astype(np.int32),
                                    rows=mine, slots=self._replica_slots(mine).astype(np.int32),
                                    hot=HotShare(union=union_slots, positions=np.searchsorted(union, mine)))
        timing = {"scoring": 0.0, "allocation": 0.0, "state_update": 0.0, "plan": time.perf_counter() - start}
        return BatchPlan(step=step, allocation=alloc, counts=counts, timing=timing, digest=digest, work=work)

    def _replica_slots(self, rows: np.ndarray) -> np.ndarray:
        """Positions of ``rows`` in the replica; a row that is not hot is an error (a misclassified input)."""
        slots = np.searchsorted(self.hot_rows, rows)
        bad = (slots >= len(self.hot_rows)) | (self.hot_rows[np.minimum(slots, len(self.hot_rows) - 1)] != rows)
        if bad.any():
            raise SchedulerError(f"row {rows[np.argmax(bad)]} of a hot batch is not hot: the calibration does "
                                 f"not belong to this data")
        return slots.astype(np.int64)


def _strip_members(first, iterator, rest: list):
    """``first`` and the batches after it up to the last of its strip; the batch after that goes to ``rest``."""
    batch = first
    while True:
        yield batch
        if batch.strip.last:
            rest.append(next(iterator, None))
            return
        batch = next(iterator, None)
        if batch is None:
            return


class _HotWork:
    """The empty transfers of a worker's hot iteration (nothing moves through the PS or between caches)."""

    def __init__(self):
        none64, none32 = np.zeros(0, np.int64), np.zeros(0, np.int32)
        self.transfer = Transfer(none64, none32)
        self.none32 = none32

    def plan(self, *, samples, index, rows, slots, hot: HotShare) -> WorkerPlan:
        return WorkerPlan(samples=samples, index=index, rows=rows, slots=slots, local=self.none32,
                          accumulate=self.none32, full_set=self.none32, writeback=self.transfer,
                          pull=self.transfer, prefetch=self.transfer, plan_push=self.transfer,
                          accumulate_turns=self.none32, accumulate_rounds=0, p2p_in=PeerTransfer.empty(),
                          p2p_out=PeerTransfer.empty(), hot=hot)
