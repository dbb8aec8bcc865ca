"""FAE's side of a worker's run: the replica of the hot rows and its synchronization (docs/design.md section 7).

The FAE scheduler (``hybrid.scheduling.fae_plans``) decides where each iteration
sits in the order of strips and what moves before it; this executes it:

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
"""
from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
import torch

from hybrid.config import Config
from hybrid.data.store import BatchStore, GlobalBatch
from hybrid.scheduling.fae_order import LossFeed, MiniBatches, fae_batches, strip_order
from hybrid.scheduling.fae_plans import FaeStep
from hybrid.runtime.rma_store import EmbeddingStore
from hybrid.scheduling.scheduler import WorkerPlan
from hybrid.scheduling.shuffle_schedule import ShuffleSchedule


class HotReplicas:
    """One worker's replica of the hot rows (``values[i]`` is row ``rows[i]``)."""

    def __init__(self, store: EmbeddingStore, calibration, *, dim: int, dtype, lead: bool, barrier: Callable[[], None],
                 hvd):
        self.store, self.lead, self.barrier, self.hvd = store, lead, barrier, hvd
        self.calibration = calibration
        self.rows = calibration.hot_rows
        self.values = np.zeros((len(self.rows), dim), dtype=dtype)
        self.feed = LossFeed()
        self.losses: list[float] = []  # held-out loss per pair, in pair order
        self.ahead = False  # the replica holds updates the PS has not received

    def batches(self, data: BatchStore, config: Config) -> Iterator[GlobalBatch]:
        """FAE's order of ``data``'s batches: strips laid out with the losses handed to :attr:`feed`."""
        mini = MiniBatches.of(data, self.calibration.hot_inputs, config.global_batch, shuffle=config.data.shuffle,
                              seed=config.data.shuffle_seed)
        return fae_batches(data, strip_order(mini, ShuffleSchedule(), self.feed.get))

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
        summed = np.zeros((len(work.hot.union), gradients.shape[1]), dtype=gradients.dtype)
        summed[work.hot.positions] = gradients
        return self.hvd.allreduce(torch.from_numpy(summed), op=self.hvd.Sum, name="fae.hot_rows").numpy()

    def update(self, work: WorkerPlan, summed: np.ndarray, lr: float) -> None:
        """SGD on the union's rows: every worker applies the same sums, so the replicas stay equal."""
        self.values[work.hot.union] -= lr * summed
        self.ahead = True
