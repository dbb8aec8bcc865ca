"""FAE: hot rows replicated on every worker, cold rows through the PS (docs/design.md section 7).

The scheduling side is in ``hybrid.scheduling``: the calibration picks the
hot rows and classifies every input hot or cold (``fae_calibration``), the
order runs hot and cold mini-batches in strips whose lengths follow the
held-out loss (``fae_order``, ``shuffle_schedule``), and the FAE scheduler
says where each iteration sits in that order and what moves before it
(``fae_plans``). A cold strip is vanilla BSP with caches (this mode's update
rule is vanilla's there). This module executes the rest:

- a hot iteration reads its rows from the replica; the gradients of the
  global batch's hot rows (the same union on every worker) are summed with
  one Horovod allreduce and applied by every worker alike, so the replicas
  stay equal;
- before a pair of strips whose previous strip was hot, worker 0 writes the
  replica to the PS and the workers meet in a barrier; then the held-out
  loss of the pair that ended is measured (the PS holds the whole model)
  and handed to the thread that lays out the strips;
- before a hot strip that follows a cold one, every worker reads the hot
  rows into its replica (the cold strip may have trained them at the PS).

Its workers hold updates the PS has not seen, so it refuses checkpoints and
mid-run evaluations.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator, Optional

import numpy as np

from hybrid.config import Config, Mode
from hybrid.data.store import BatchStore, GlobalBatch
from hybrid.modes.base import WorkerContext
from hybrid.modes.vanilla import Vanilla
from hybrid.scheduling.fae_order import LossFeed, MiniBatches, fae_batches, replayed_batches, strip_order
from hybrid.scheduling.fae_plans import FaeScheduler, FaeStep, calibration_for
from hybrid.scheduling.plans import BatchPlan, WorkerPlan
from hybrid.scheduling.policy import Allocation, SchedulePolicy, SchedulerError, Sync
from hybrid.scheduling.shuffle_schedule import ShuffleSchedule

if TYPE_CHECKING:
    from hybrid.runtime.rma_store import EmbeddingStore


class HotReplicas:
    """One worker's replica of the hot rows (``values[i]`` is row ``rows[i]``)."""

    def __init__(self, store: "EmbeddingStore", calibration, *, dim: int, dtype, lead: bool,
                 barrier: Callable[[], None], hvd):
        self.store, self.lead, self.barrier, self.hvd = store, lead, barrier, hvd
        self.calibration = calibration
        self.rows = calibration.hot_rows
        self.values = np.zeros((len(self.rows), dim), dtype=dtype)
        self.feed = LossFeed()
        self.losses: list[float] = []  # held-out loss per pair, in pair order
        self.ahead = False  # the replica holds updates the PS has not received

    def batches(self, data: BatchStore, config: Config) -> Iterator[GlobalBatch]:
        """FAE's order of ``data``'s batches: strips laid out with the losses handed to :attr:`feed`."""
        def passes(epoch: int) -> MiniBatches:
            return MiniBatches.of(data, self.calibration.hot_inputs, config.global_batch,
                                  shuffle=config.data.shuffle, seed=config.data.shuffle_seed, epoch=epoch)

        return fae_batches(data, strip_order(passes, ShuffleSchedule(), self.feed.get))

    def before(self, step: FaeStep, heldout_loss: Callable[[], float]) -> None:
        """The synchronization that precedes an iteration (collective over the workers when there is one)."""
        if step.push_replicas:
            self.push()
        if step.observe is not None:
            loss = heldout_loss()
            self.losses.append(loss)
            self.feed.put(loss)
        if step.pull_replicas:
            self.store.pull(self.rows, self.values).wait()

    def push(self) -> None:
        """Worker 0 writes the replica to the PS; the barrier keeps every read after it."""
        if self.lead:
            self.store.put(self.rows, self.values).wait()
        self.ahead = False
        self.barrier()

    def allreduce(self, work: WorkerPlan, gradients: np.ndarray) -> np.ndarray:
        """The summed gradients of the global batch's hot rows (``work.hot.union``), from every worker's share."""
        import torch

        summed = np.zeros((len(work.hot.union), gradients.shape[1]), dtype=gradients.dtype)
        summed[work.hot.positions] = gradients
        return self.hvd.allreduce(torch.from_numpy(summed), op=self.hvd.Sum, name="fae.hot_rows").numpy()

    def update(self, work: WorkerPlan, summed: np.ndarray, lr: float) -> None:
        """SGD on the union's rows: every worker applies the same sums, so the replicas stay equal."""
        self.values[work.hot.union] -= lr * summed
        self.ahead = True


class Fae(Vanilla):
    """Hot and cold strips: hot iterations on the replica, cold ones as vanilla BSP with caches."""

    name = Mode.fae
    schedule = SchedulePolicy(Allocation.hot_cold, Sync.fae_replicas)
    checkpoints = False
    rowwise_optimizers = False
    sixteen_bit_wire = False
    reference_order = False
    _no_sixteen_bit_wire = ("its hot rows' gradient allreduce and the replica's synchronization at strip switches "
                            "have no 16-bit rounding defined yet")

    @classmethod
    def check_settings(cls, config: Config) -> None:
        if config.data.test_fraction <= 0 and config.data.validation_fraction <= 0:
            raise SchedulerError("scheduler.mode=fae follows the held-out loss between strips: "
                                 "use data.validation_fraction > 0 or data.test_fraction > 0")

    @classmethod
    def simulation(cls, config: Config, store: BatchStore, length: int, losses: Optional[list] = None, *,
                   worker: Optional[int] = None):
        """FAE's scheduler and its strips over ``store`` (without end: the caller takes ``length``), laid out
        with ``losses`` (or none); ``worker`` as for the other modes.

        The strip lengths follow the held-out loss, which only training
        measures: without ``losses`` (per pair, as a run logged them) the
        rate stays at its start.
        """
        calibration = calibration_for(config, store, say=lambda *_: None)
        scheduler = FaeScheduler(cls.scheduler_for(config, cardinalities=store.cardinalities, worker=worker),
                                 calibration.hot_rows)
        batches = replayed_batches(store, calibration.hot_inputs, config.global_batch,
                                   shuffle=config.data.shuffle, seed=config.data.shuffle_seed, losses=losses)
        return scheduler, batches

    def __init__(self, context: WorkerContext):
        roles = context.roles
        if roles.worker == 0:  # worker 0 makes and stores the calibration, the others then read it
            calibration_for(context.config, context.data)
        roles.worker_barrier()
        calibration = calibration_for(context.config, context.data, say=lambda *_: None)
        self.replicas = HotReplicas(context.table, calibration, dim=context.config.model.embedding_dim,
                                    dtype=context.dtype, lead=roles.worker == 0, barrier=roles.worker_barrier,
                                    hvd=context.hvd)
        # the validation split (else the test split), whose first samples give the held-out loss that sets
        # the strip lengths
        data = context.config.data
        self.heldout = BatchStore.of(data, "validation" if data.validation_fraction else "test")
        super().__init__(context)

    def worker_scheduler(self) -> FaeScheduler:
        return FaeScheduler(super().worker_scheduler(), self.replicas.rows)

    def batches(self, start_batch: int) -> Iterator[GlobalBatch]:
        """FAE's strips (its runs are not resumed: ``start_batch`` is 0)."""
        return self.replicas.batches(self.context.data, self.config)

    def begin(self, plan: BatchPlan) -> list:
        """The replica's synchronization and the held-out loss the plan asks for, before the iteration."""
        self.replicas.before(plan.fae, self._heldout_loss)
        return []

    def reads_ahead(self, plan: BatchPlan) -> bool:
        """Nothing of an iteration is read ahead when the replica is written to the PS before it."""
        return not plan.fae.push_replicas

    def embeddings(self, work: WorkerPlan) -> np.ndarray:
        return self.cache if work.hot is None else self.replicas.values

    def reduce(self, work: WorkerPlan, gradients: np.ndarray) -> np.ndarray:
        """Hot iterations: the global batch's hot-row gradients, summed over the workers."""
        return gradients if work.hot is None else self.replicas.allreduce(work, gradients)

    def update(self, work: WorkerPlan, gradients: np.ndarray) -> list:
        """Hot iterations: SGD on the replica with the summed gradients (no PS traffic); cold ones: vanilla's."""
        if work.hot is None:
            return super().update(work, gradients)
        self.replicas.update(work, gradients, self.embedding_lr)
        return []

    def flush(self) -> None:
        """The replica's updates, then the caches' dirty rows, to the PS."""
        if self.replicas.ahead:
            self.replicas.push()
        super().flush()

    def finish(self) -> None:
        self.replicas.feed.close()  # the scheduler thread may wait for a loss that will not come

    def _heldout_loss(self) -> float:
        """The log loss on the first ``fae.heldout_samples`` test samples, the same on every worker."""
        result = self.context.evaluate(self.heldout, limit=self.config.fae.heldout_samples)
        return self.roles.workers.bcast(result["logloss"] if result is not None else None, root=0)
