"""What a training mode is: scheduling choices, and the hooks the training loop calls (docs/design.md section 7).

A mode is one class in one module of this package. Its class attributes and
class methods are its scheduling side, used on every rank and by the
simulator without MPI: the allocation and synchronization it asks of the
scheduler (:class:`~hybrid.scheduling.policy.SchedulePolicy`), the settings
it refuses, the scheduler and batch order it runs. An instance, made on each
worker by the training loop, is its worker side: the loop
(``hybrid.training.loop``) knows only the stages of an iteration and calls
these hooks at fixed points, in this order::

    pull       begin(plan)              before the iteration's reads are issued; returns
                                        store handles the loop completes with its reads
               (loop: write-backs, pulls, prefetched rows placed)
               after_reads(work)        after every read of the iteration has landed
               reads_ahead(next_plan)   may the next iteration's rows be read now?
    compute    embeddings(work)         the rows-by-slot array the samples' rows come from
    allreduce  reduce(work, gradients)  the embedding gradients to apply (after the MLP's allreduce)
    push       update(work, gradients)  apply them; returns the started PS writes
    barrier    (loop)
    end        flush(), finish(), close()

Everything a worker executes is in its :class:`~hybrid.scheduling.plans.WorkerPlan`
(``work``): the loop moves the rows every cached mode moves (write-backs,
pulls, prefetches) and the mode decides the rest. Importing a mode must not
start MPI or load torch (``hybrid simulate`` runs without them): the worker
side imports the runtime's MPI modules where it uses them.
"""
from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar, Iterator, Optional

import numpy as np

from hybrid.config import Config, EmbeddingOptimizer, Mode, SyncMode, WirePrecision
from hybrid.data.store import BatchStore, GlobalBatch
from hybrid.runtime import launch_facts
from hybrid.scheduling.plans import BatchPlan, WorkerPlan
from hybrid.scheduling.policy import SchedulePolicy, SchedulerError, Sync
from hybrid.scheduling.scheduler import Scheduler

if TYPE_CHECKING:
    from hybrid.runtime.comm import Roles
    from hybrid.runtime.rma_store import EmbeddingStore, Handle


def run_length(config: Config, store: BatchStore) -> int:
    """Global batches the run trains: ``train.iterations``, or ``train.epochs`` passes over ``store``."""
    return config.run_length(store.num_batches(config.global_batch))


@dataclass(frozen=True)
class WorkerContext:
    """What a mode's worker side works with; the training loop builds it on each worker."""

    config: Config
    roles: "Roles"
    table: "EmbeddingStore"  # the PS tier (every rank's windows)
    data: BatchStore  # the training split
    hvd: object  # the workers' collectives: horovod.torch on their communicator, or comm.MpiCollectives
    evaluate: Callable[..., Optional[dict]]  # (store, limit=None): the loop's evaluation, collective over workers

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.config.model.precision.value)


class TrainingMode(abc.ABC):
    """One training mode. Subclasses set ``name`` and ``schedule`` and implement :meth:`update` and :meth:`flush`."""

    name: ClassVar[Mode]
    schedule: ClassVar[SchedulePolicy]
    checkpoints: ClassVar[bool] = True  # checkpoints, mid-run evaluations, deterministic accumulation
    store_versions: ClassVar[bool] = False  # the PS keeps a version counter per row
    rowwise_optimizers: ClassVar[bool] = True  # trains embeddings with train.embedding_optimizer=rowwise_adagrad
    # its transfers round as docs/design.md section 14 defines (cluster.wire_precision=bf16); else refused
    sixteen_bit_wire: ClassVar[bool] = True
    # its batches and schedule follow the store alone, so hybrid simulate and the single-process reference repeat
    # them (FAE's strips follow the held-out loss training measures)
    reference_order: ClassVar[bool] = True
    # settings (each a case's "+"-joined overrides) that give this mode another schedule of the same model: every
    # test and benchmark that runs each mode runs these too (herald's P2P sync)
    variants: ClassVar[tuple[str, ...]] = ()

    # ------------------------------------------------------- scheduling side
    @classmethod
    def check(cls, config: Config) -> None:
        """Raise :class:`SchedulerError` when this mode cannot run ``config`` (cheap: before any collective)."""
        if config.scheduler.staleness and cls.schedule.sync is not Sync.het_clocks:
            raise SchedulerError(f"scheduler.staleness={config.scheduler.staleness} applies to mode het only; "
                                 f"use scheduler.staleness=0 with mode {cls.name.value}")
        if config.scheduler.sync is SyncMode.p2p and cls.schedule.sync is not Sync.on_demand:
            raise SchedulerError(f"scheduler.sync=p2p needs an on-demand mode (plan or herald), "
                                 f"not {cls.name.value}")
        cls.schedule.check(config)
        if not cls.checkpoints:
            cls._refuse_unsaved(config)
        if config.train.embedding_optimizer is not EmbeddingOptimizer.sgd and not cls.rowwise_optimizers:
            raise SchedulerError(f"train.embedding_optimizer={config.train.embedding_optimizer.value} is not "
                                 f"supported with scheduler.mode={cls.name.value}: its workers update rows apart "
                                 f"(HET's stale copies, FAE's replicas), so no summed gradient exists to update "
                                 f"a row with; use train.embedding_optimizer=sgd or a BSP mode")
        if config.cluster.wire_precision is not WirePrecision.fp32 and not cls.sixteen_bit_wire:
            raise SchedulerError(f"cluster.wire_precision={config.cluster.wire_precision.value} is not supported "
                                 f"with scheduler.mode={cls.name.value}: {cls._no_sixteen_bit_wire}; use "
                                 f"cluster.wire_precision=fp32 or a BSP mode (docs/design.md section 14)")
        cls.check_settings(config)

    _no_sixteen_bit_wire: ClassVar[str] = ""  # why not, when sixteen_bit_wire is False

    @classmethod
    def check_settings(cls, config: Config) -> None:
        """What else this mode refuses (after the common checks); nothing by default."""

    @classmethod
    def _refuse_unsaved(cls, config: Config) -> None:
        """A mode whose workers hold updates the PS has not seen refuses what needs the PS complete mid-run."""
        refused = {"train.checkpoint_every": config.train.checkpoint_every,
                   "train.eval_every": config.train.eval_every,
                   "train.deterministic": config.train.deterministic}
        for key, value in refused.items():
            if value:
                raise SchedulerError(f"{key}={value} is not supported with scheduler.mode={cls.name.value}: "
                                     f"its workers hold updates the PS has not seen (HET's caches, FAE's "
                                     f"replicas), which checkpoints and mid-run evaluations do not carry yet; "
                                     f"use {key}=0 or another mode")

    @classmethod
    def scheduler_for(cls, config: Config, *, cardinalities, worker: Optional[int] = None) -> Scheduler:
        """The scheduler over the cluster state with this mode's choices (``worker``: the runtime's own)."""
        cls.check(config)
        threads = launch_facts.scheduler_threads(config.scheduler.threads, config.train.threads)
        config = dataclasses.replace(config, scheduler=dataclasses.replace(config.scheduler, threads=threads))
        return Scheduler.from_config(config, cardinalities=cardinalities, policy=cls.schedule, worker=worker)

    @classmethod
    def simulation(cls, config: Config, store: BatchStore, length: int, losses: Optional[list] = None, *,
                   worker: Optional[int] = None):
        """(scheduler, the batches of ids of ``length`` iterations) for ``hybrid simulate``; ``losses``: FAE's;
        ``worker``: the scheduler annotates the events as that worker's runtime needs them (which pulls may
        be read ahead) and makes its plans."""
        scheduler = cls.scheduler_for(config, cardinalities=store.cardinalities, worker=worker)
        return scheduler, (b.sparse for b in cls._store_order(config, store, stop_batch=length))

    @staticmethod
    def _store_order(config: Config, store: BatchStore, start_batch: int = 0,
                     stop_batch: Optional[int] = None) -> Iterator[GlobalBatch]:
        """The global batches up to ``stop_batch`` (default: the run's), epoch after epoch: in file order, or
        shuffled afresh each epoch with ``data.shuffle`` (the same on every rank)."""
        return store.batches(config.global_batch, shuffle=config.data.shuffle, seed=config.data.shuffle_seed,
                             start_batch=start_batch, stop_batch=stop_batch or run_length(config, store))

    # ----------------------------------------------------------- worker side
    def __init__(self, context: WorkerContext):
        self.context = context
        self.config, self.roles, self.table = context.config, context.roles, context.table
        self.scheduler = self.worker_scheduler()
        self.cache = np.zeros((self.scheduler.state.capacity, self.config.row_width),
                              dtype=context.dtype)  # this worker's cached rows, by slot
        self.embedding_lr = self.config.train.embedding_lr  # the iteration's rate: the loop sets it (lr_schedule)

    def worker_scheduler(self):
        """This worker's scheduler: every worker runs its own, identically (no schedule is sent)."""
        return self.scheduler_for(self.config, cardinalities=self.context.data.cardinalities,
                                  worker=self.roles.worker)

    def batches(self, start_batch: int) -> Iterator[GlobalBatch]:
        """The global batches in training order, from batch ``start_batch`` (a resumed run's)."""
        return self._store_order(self.config, self.context.data, start_batch)

    def begin(self, plan: BatchPlan) -> list["Handle"]:
        """Start what precedes the iteration's reads; returns store handles to complete with them."""
        return []

    def after_reads(self, work: WorkerPlan) -> None:
        """Every read of the iteration (pulls, prefetched rows, the handles of :meth:`begin`) has landed."""

    def reads_ahead(self, plan: BatchPlan) -> bool:
        """Whether ``plan``'s prefetchable rows may be read while the current iteration runs."""
        return True

    def embeddings(self, work: WorkerPlan) -> np.ndarray:
        """The rows-by-slot array ``work.slots`` index into."""
        return self.cache

    def reduce(self, work: WorkerPlan, gradients: np.ndarray) -> np.ndarray:
        """The gradients of ``work.rows`` to apply, from this worker's own (``[len(rows), dim]``)."""
        return gradients

    @abc.abstractmethod
    def update(self, work: WorkerPlan, gradients: np.ndarray) -> list["Handle"]:
        """Apply the embedding updates; returns the started PS writes (the loop completes them)."""

    @abc.abstractmethod
    def flush(self) -> None:
        """Write every update the PS has not seen to it (collective over workers: the loop barriers after)."""

    def finish(self) -> None:
        """Training ended, normally or not: release whatever waits for the loop."""

    def close(self) -> None:
        """Free what the mode holds besides memory (communicators)."""
