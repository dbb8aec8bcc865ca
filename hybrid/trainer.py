"""The hybrid-parallel training loop of one rank (DESIGN.md sections 2-3).

Workers train their share of each global batch: the scheduler (every worker
runs its own, identically) says which samples are theirs and which
embedding rows move where; this loop executes those events against the RMA
store and the worker's cache, runs forward/backward, allreduces MLP
gradients with Horovod and applies the embedding updates. PS ranks only
host the store.

Phase order of an iteration (every RMA phase completes before the next):
write-backs of evicted dirty rows, pulls into their slots, forward/backward
and MLP allreduce, embedding updates (local SGD, Accumulate of shared rows,
full-set pushes), plan pushes, then a barrier of the workers.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Optional

import numpy as np
import torch

from hybrid._ext.cluster_state import ACCUMULATE, FULL_SET_PUSH, LOCAL, P2P, PLAN_PUSH, PULL, WRITEBACK
from hybrid.comm import Roles, init_horovod
from hybrid.config import Config, SyncMode
from hybrid.data.store import BatchStore
from hybrid.embedding_init import initial_rows
from hybrid.models import build_model, dense_optimizer
from hybrid.rma_store import EmbeddingStore
from hybrid.scheduler import BatchPlan, Scheduler


class _End:
    """Typed end marker of the plan queue."""


class PlanProducer:
    """Runs the scheduler ahead of training in a thread, handing plans over a bounded queue."""

    def __init__(self, scheduler: Scheduler, batches: Iterable[np.ndarray], depth: int = 2):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(scheduler, batches), daemon=True,
                                        name="scheduler")
        self._thread.start()

    def _run(self, scheduler: Scheduler, batches) -> None:
        try:
            for plan in scheduler.plans(batches):
                while not self._stop.is_set():
                    try:
                        self._queue.put(plan, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
            self._queue.put(_End())
        except BaseException as err:  # handed to the consumer, which re-raises it
            self._queue.put(err)

    def __iter__(self) -> Iterator[BatchPlan]:
        while True:
            item = self._queue.get()
            if isinstance(item, _End):
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class _Clock:
    """Seconds between successive laps, by stage name (the iteration time breakdown)."""

    def __init__(self):
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.laps[stage] = self.laps.get(stage, 0.0) + now - self._last
        self._last = now


@dataclass
class WorkerCache:
    """The cached embedding rows of one worker; the cluster state names the slots."""

    values: np.ndarray  # [capacity, dim]


class HybridTrainer:
    """One rank's part of a training run; construct on every rank (collective)."""

    def __init__(self, config: Config, roles: Roles, store: BatchStore):
        if config.scheduler.sync is SyncMode.p2p:
            raise ValueError("scheduler.sync=p2p runs in the simulator only so far; the runtime executes "
                             "PS plans (scheduler.sync=ps)")
        if config.train.eval_every:
            raise ValueError("train.eval_every is not implemented yet: evaluation runs once, after training; "
                             "set train.eval_every=0")
        self.config, self.roles, self.data = config, roles, store
        self.dtype = np.dtype(config.model.precision.value)
        self.torch_dtype = getattr(torch, config.model.precision.value)
        n_rows = int(store.cardinalities.sum())
        dim = config.model.embedding_dim
        self.table = EmbeddingStore(roles.world, roles.ps_ranks, n_rows, dim, dtype=self.dtype,
                                    init=lambda rows: initial_rows(config.seed, rows, dim, self.dtype))
        self.hvd = init_horovod(roles)
        if roles.is_ps:
            return
        self.scheduler = Scheduler.from_config(config, cardinalities=store.cardinalities, record_events=True)
        if config.train.verify_cache:
            self.scheduler.snapshot_worker = roles.worker
        self.cache = WorkerCache(np.zeros((self.scheduler.state.capacity, dim), dtype=self.dtype))
        self.device = self._device(config.train.device)
        self.model = build_model(config.model, n_dense=store.n_dense, n_tables=store.n_tables,
                                 seed=config.seed).to(self.device)
        self.hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        self.optimizer = self.hvd.DistributedOptimizer(
            dense_optimizer(config, self.model.parameters()),
            named_parameters=self.model.named_parameters(), op=self.hvd.Sum)

    def _device(self, wanted: str) -> torch.device:
        """The model's device. The cache stays in host memory: RMA reads and writes it."""
        gpu = torch.cuda.is_available() and self.hvd.nccl_built()
        if wanted == "cuda" and not gpu:
            raise ValueError("train.device=cuda needs CUDA and a Horovod built with NCCL "
                             "(HOROVOD_GPU_OPERATIONS=NCCL bash launch/setup.sh); use train.device=cpu")
        if wanted == "cpu" or not gpu:
            return torch.device("cpu")
        return torch.device("cuda", self.hvd.local_rank() % torch.cuda.device_count())

    # -------------------------------------------------------------- training
    def train(self, iterations: int, on_step: Optional[Callable[[dict], None]] = None) -> list[dict]:
        """Run ``iterations`` global batches; returns one record per iteration (workers) or [].

        A record holds the plan's event counts, the rows this worker moved
        through the store (``moved``), the plan digest, the stage times and
        the summed loss of this worker's samples (``loss_sum``).
        """
        if self.roles.is_ps:
            return []
        batches = self.data.batches(self.config.global_batch, shuffle=self.config.data.shuffle,
                                    seed=self.config.data.shuffle_seed)
        for_scheduler, for_training = itertools.tee(itertools.islice(batches, iterations))
        producer = PlanProducer(self.scheduler, (b.sparse for b in for_scheduler))
        log = []
        try:
            plans = iter(producer)
            while True:
                waited = time.perf_counter()
                plan = next(plans, None)
                if plan is None:
                    break
                batch = next(for_training)
                before = dict(self.table.rows_moved)
                timing = {"schedule_wait": time.perf_counter() - waited, **self.step(plan, batch)}
                moved = {k: self.table.rows_moved[k] - before[k] for k in before}
                record = {"step": plan.step, "counts": plan.counts, "moved": moved, "digest": plan.digest(),
                          "timing": timing, "samples": len(batch), "loss_sum": self.last_loss}
                log.append(record)
                if on_step is not None:
                    on_step(record)
        finally:
            producer.close()
        return log

    def step(self, plan: BatchPlan, batch) -> dict:
        """One iteration; returns seconds per stage."""
        clock = _Clock()
        me = self.roles.worker
        kind, worker, row, slot, _, _ = plan.events
        train = np.arange(len(kind)) < plan.n_train_events
        mine = worker == me
        values = self.cache.values

        def of(event_kind, phase=train):
            chosen = mine & phase & (kind == event_kind)
            return row[chosen], slot[chosen]

        if ((kind == P2P) & mine).any():
            raise RuntimeError("P2P events reached the runtime, which executes PS plans only")
        rows, slots = of(WRITEBACK)
        self.table.put(rows, values[slots]).wait()
        rows, slots = of(PULL)
        pulled = np.empty((len(rows), values.shape[1]), dtype=self.dtype)
        self.table.pull(rows, pulled).wait()
        values[slots] = pulled
        clock.lap("pull")

        gradients = self.forward_backward(plan, batch, row[mine & train & self._updates(kind)],
                                          slot[mine & train & self._updates(kind)], clock)
        lr = self.config.train.embedding_lr
        handles = []
        rows, slots = of(LOCAL)
        values[slots] -= lr * gradients[slots]
        rows, slots = of(ACCUMULATE)
        handles.append(self.table.accumulate(rows, -lr * gradients[slots]))
        rows, slots = of(FULL_SET_PUSH)
        values[slots] -= lr * gradients[slots]
        handles.append(self.table.put(rows, values[slots]))
        rows, slots = of(PLAN_PUSH, ~train)
        handles.append(self.table.put(rows, values[slots]))
        for handle in handles:
            handle.wait()
        clock.lap("push")
        self.roles.workers.Barrier()
        clock.lap("barrier")
        if plan.snapshot is not None:
            self.verify_cache(plan.snapshot)
        return clock.laps

    def verify_cache(self, snapshot: dict) -> None:
        """Check that every cached row this worker holds fresh, and the PS holds too, equals the PS copy.

        ``snapshot`` is the state at the end of the iteration just run (see
        ``Scheduler.snapshot_worker``: the scheduler thread is already ahead).
        Dirty rows (only this worker has the latest value) cannot be checked
        against the PS. Copies are exact, so any difference is a bug.
        """
        me = self.roles.worker
        cached = snapshot["cache_rows"]
        slots = np.flatnonzero(cached >= 0)
        rows = cached[slots].astype(np.int64)
        checkable = snapshot["fresh"][rows] & snapshot["at_ps"][rows]
        rows, slots = rows[checkable], slots[checkable]
        at_ps = np.empty((len(rows), self.cache.values.shape[1]), dtype=self.dtype)
        self.table.pull(rows, at_ps).wait()
        bad = np.flatnonzero((at_ps != self.cache.values[slots]).any(axis=1))
        if len(bad):
            raise RuntimeError(f"worker {me}: {len(bad)} fresh cached rows differ from the PS, e.g. row "
                               f"{rows[bad[0]]} in slot {slots[bad[0]]}; the cache and the cluster state disagree")

    @staticmethod
    def _updates(kind: np.ndarray) -> np.ndarray:
        return (kind == LOCAL) | (kind == ACCUMULATE) | (kind == FULL_SET_PUSH)

    def forward_backward(self, plan: BatchPlan, batch, rows: np.ndarray, slots: np.ndarray,
                         clock: "_Clock") -> np.ndarray:
        """Train this worker's samples; returns the embedding gradient per cache slot."""
        mine = np.flatnonzero(plan.allocation == self.roles.worker)
        sample_rows = self.scheduler.global_rows(batch.sparse[mine])
        order = np.argsort(rows)
        sample_slots = slots[order][np.searchsorted(rows[order], sample_rows)]
        emb = torch.from_numpy(self.cache.values[sample_slots]).to(self.device).requires_grad_(True)
        dense = torch.from_numpy(batch.dense[mine]).to(self.device, self.torch_dtype)
        labels = torch.from_numpy(batch.labels[mine]).to(self.device, self.torch_dtype)
        logits = self.model(dense, emb)
        # the global batch's mean loss: each worker sums its samples over the global batch size,
        # and the MLP gradients are summed (not averaged) over the workers
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="sum") / len(batch)
        self.optimizer.zero_grad()
        loss.backward()
        clock.lap("compute")
        self.optimizer.step()  # waits for the MLP gradient allreduce
        clock.lap("allreduce")
        self.last_loss = float(loss.detach()) * len(batch)  # this worker's summed sample losses
        gradients = np.zeros_like(self.cache.values)
        np.add.at(gradients, sample_slots.ravel(), emb.grad.cpu().numpy().reshape(-1, gradients.shape[1]))
        return gradients

    # ------------------------------------------------------------ inspection
    def flush(self) -> None:
        """Write every dirty row to the PS (collective over workers), e.g. before reading the table."""
        if self.roles.is_ps:
            return
        workers, rows, slots = self.scheduler.state.flush_dirty()
        mine = workers == self.roles.worker
        self.table.put(rows[mine], self.cache.values[slots[mine]]).wait()
        self.roles.workers.Barrier()

    def evaluate(self, test: BatchStore, batch_size: int = 4096) -> Optional[dict]:
        """AUC and log loss on ``test`` after :meth:`flush`; the result on worker 0, None elsewhere.

        Workers split the test samples, read their rows straight from the PS
        (the latest model after the flush) and gather predictions to worker 0.
        """
        if self.roles.is_ps:
            return None
        from sklearn.metrics import log_loss, roc_auc_score

        me, n = self.roles.worker, self.roles.n_workers
        offsets = self.data.table_offsets
        probabilities, labels = [], []
        positions = np.arange(test.start, test.stop)[me::n]
        with torch.no_grad():
            for begin in range(0, len(positions), batch_size):
                batch = test.gather(0, positions[begin:begin + batch_size])
                rows = batch.sparse.astype(np.int64) + offsets
                unique, inverse = np.unique(rows, return_inverse=True)
                values = np.empty((len(unique), self.config.model.embedding_dim), dtype=self.dtype)
                self.table.pull(unique, values).wait()
                emb = torch.from_numpy(values[inverse.reshape(rows.shape)]).to(self.device)
                logits = self.model(torch.from_numpy(batch.dense).to(self.device, self.torch_dtype), emb)
                probabilities.append(torch.sigmoid(logits).cpu().numpy())
                labels.append(batch.labels)
        gathered = self.roles.workers.gather((np.concatenate(probabilities or [np.zeros(0)]),
                                              np.concatenate(labels or [np.zeros(0)])), root=0)
        if me != 0:
            return None
        p = np.concatenate([g[0] for g in gathered])
        y = np.concatenate([g[1] for g in gathered])
        if len(y) == 0 or len(np.unique(y)) < 2:
            return {"samples": int(len(y)), "auc": float("nan"), "logloss": float("nan")}
        return {"samples": int(len(y)), "auc": float(roc_auc_score(y, p)),
                "logloss": float(log_loss(y, np.clip(p, 1e-7, 1 - 1e-7)))}

    def close(self) -> None:
        """Free the store (collective over all ranks)."""
        if self.hvd is not None:
            self.hvd.shutdown()
        self.table.close()
