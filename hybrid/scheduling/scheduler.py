"""The embedding scheduler: allocation policy + cluster state, one batch ahead.

For each iteration ``t`` it yields a :class:`BatchPlan`: the allocation of
batch ``t``, the event counts of all workers (from the cluster state's
``train``, and ``plan`` for the pushes batch ``t + 1`` needs, which is why
batch ``t + 1`` is allocated before ``t`` is handed out), a digest of every
worker's events, and the share of one worker (:class:`WorkerPlan`), read
from that worker's own runs of events so that it costs what the share
costs. Every rank runs its own scheduler on the same batches
and reaches the same plans (docs/design.md section 3: nothing is sent).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Optional

import numpy as np

from hybrid._ext.cluster_state import KIND_NAMES, ClusterState
from hybrid._ext.hash_kernels import array_digest
from hybrid.config import Config, EmbeddingOptimizer
from hybrid.scheduling.allocation import AllocationPolicy
from hybrid.scheduling.event_kinds import EXTRA_KINDS
from hybrid.scheduling.plans import BatchPlan, PeerTransfer, StaleShare, Transfer, WorkerPlan
from hybrid.scheduling.policy import SchedulePolicy, SchedulerError


def let_the_loop_run() -> None:
    """Release the interpreter lock for a moment, so that a thread waiting for it takes it now.

    A worker's scheduler makes its plans in a thread beside the training
    loop's backward pass (hybrid.scheduling.plan_producer), and that pass
    takes the lock many times on its way, each time waiting for the run of
    Python that holds it to end. Called between a plan's steps, it bounds
    each wait by one step: with one worker on W1 smoke the backward pass
    took 1.11-1.14 ms beside the scheduler, 1.05-1.07 with these releases
    and 0.99 with no scheduler beside it (docs/benchmarks.md, issue 54).
    ``sleep(0)`` keeps this thread off the lock long enough for the woken
    one to take it: about 74 us on the 2-core machine (2026-11-30;
    ``os.sched_yield`` returns in 0.5 us, likely before the woken thread
    runs, and was not tried in the loop), so a scheduler with no loop
    beside it (the simulator, the benchmarks) does not call it
    (:attr:`Scheduler.beside_a_loop`).
    """
    time.sleep(0)


class BatchStream:
    """The batches in order; with ``look_ahead``, the one after the next is read early for the allocation.

    That early batch's global rows are kept (:meth:`rows_of`), so the
    allocation meets the very array it was shown early.
    """

    def __init__(self, batches: Iterable[np.ndarray], look_ahead: bool):
        self._batches = iter(batches)
        self._early: list = []
        self.look_ahead = look_ahead
        self._converted: tuple = (None, None)  # (a batch, its global rows)

    def next(self) -> Optional[np.ndarray]:
        """The next batch, or None at the end."""
        return self._early.pop() if self._early else next(self._batches, None)

    def following(self) -> Optional[np.ndarray]:
        """The batch after the one :meth:`next` returned last (None at the end, or when not looking ahead)."""
        if not self.look_ahead:
            return None
        if not self._early:
            self._early.append(next(self._batches, None))
        return self._early[0]

    def rows_of(self, batch: np.ndarray, convert) -> np.ndarray:
        """``convert(batch)``, computed once for a batch seen early and again as the next."""
        if self._converted[0] is not batch:
            self._converted = (batch, convert(batch))
        return self._converted[1]


def shared_rows(rows: np.ndarray, allocation: np.ndarray, n_workers: int) -> np.ndarray:
    """The rows of a global batch that samples of two or more workers use, sorted.

    These are the rows the cluster state updates by accumulation (each
    trainer adds its part at the PS); a pure function of the batch and its
    allocation, so every worker and the simulator find the same ones.
    """
    pairs = np.unique(rows * n_workers + allocation.astype(np.int64)[:, None])
    trained, trainers = np.unique(pairs // n_workers, return_counts=True)
    return trained[trainers > 1]


def cache_capacity(n_rows: int, ratio: float, samples_per_worker: int, n_tables: int) -> int:
    """Cache slots per worker for ``ratio`` of all rows; refuses less than one working set.

    ``samples_per_worker``: the most samples the allocation gives one worker
    (``AllocationPolicy.largest_share``; the batch per worker where it
    balances), each needing a row of every table in the worker's cache.
    """
    capacity = int(round(n_rows * ratio))
    working_set = samples_per_worker * n_tables
    if capacity < min(working_set, n_rows):
        need = min(working_set, n_rows) / n_rows
        raise SchedulerError(
            f"cache.ratio={ratio} gives {capacity} slots per worker, but one iteration may need up to "
            f"{min(working_set, n_rows)} rows ({samples_per_worker} samples on one worker x {n_tables} tables); "
            f"use cache.ratio >= {need:.4f}")
    return min(capacity, n_rows)


@dataclass
class Scheduler:
    """Runs a mode's allocation policy and the cluster state over global batches.

    With a ``worker`` (the runtime's own), each plan carries that worker's
    :class:`WorkerPlan` and a digest of every worker's events; without one
    (the simulator) only counts.
    """

    state: ClusterState
    policy: AllocationPolicy
    table_offsets: np.ndarray
    snapshot_worker: Optional[int] = None  # debug: attach this worker's end-of-iteration state to plans
    sums_shared_rows: bool = False  # row-wise Adagrad: plans name the shared rows (summed before their update)
    # called with "train" and then "plan" right after each of those state calls, while the state's events
    # are that call's (hybrid.projection reads every worker's events there)
    observe: Optional[Callable[[str], None]] = None
    beside_a_loop: bool = False  # a training loop shares the interpreter lock: release it between steps
    _timing: dict = field(default_factory=dict)
    _next: tuple = (0, None)  # (step, allocation) of the batch after the plan last yielded

    def _let_the_loop_run(self) -> None:
        if self.beside_a_loop:
            let_the_loop_run()

    @staticmethod
    def capacity(config: Config, cardinalities, policy: SchedulePolicy) -> int:
        """Cache slots per worker for ``config``; :class:`SchedulerError` when that is less than one working
        set of the largest share ``policy``'s allocation gives a worker.

        Cheap (nothing is allocated), so training runs it on every rank
        before any collective: such an error then stops every rank alike.
        """
        cardinalities = np.asarray(cardinalities, dtype=np.int64)
        return cache_capacity(int(cardinalities.sum()), config.cache.ratio, policy.largest_share(config),
                              len(cardinalities))

    @classmethod
    def from_config(cls, config: Config, *, cardinalities, policy: SchedulePolicy,
                    worker: Optional[int] = None) -> "Scheduler":
        """A scheduler of ``policy`` (a mode's choices, see ``hybrid.modes``) over tables of ``cardinalities``."""
        capacity = cls.capacity(config, cardinalities, policy)
        cardinalities = np.asarray(cardinalities, dtype=np.int64)
        n_rows, n_tables = int(cardinalities.sum()), len(cardinalities)
        max_pairs = config.cluster.workers * config.train.batch_per_worker * n_tables
        state = policy.cluster_state(config, n_rows=n_rows, capacity=capacity, max_pairs=max_pairs, worker=worker)
        offsets = np.concatenate([[0], np.cumsum(cardinalities)[:-1]]).astype(np.int64)
        return cls(state=state, policy=policy.allocation_policy(config, state, cardinalities), table_offsets=offsets,
                   sums_shared_rows=config.train.embedding_optimizer is not EmbeddingOptimizer.sgd)

    def global_rows(self, sparse: np.ndarray) -> np.ndarray:
        """Per-table ids [B, tables] -> global row ids (tables back to back), int64, C-ordered.

        One ufunc pass into one new array: casting first, then adding, wrote
        and read a second batch-sized array.
        """
        return np.add(sparse, self.table_offsets, dtype=np.int64, casting="unsafe", order="C")

    def _allocate(self, stream: BatchStream, sparse: np.ndarray, iteration: int) -> tuple[np.ndarray, np.ndarray]:
        """The allocation of batch ``sparse``, shown the batch after it when the policy reads ahead."""
        rows = stream.rows_of(sparse, self.global_rows)
        following = stream.following()
        alloc = self.policy.allocate(rows, iteration,
                                     None if following is None else stream.rows_of(following, self.global_rows))
        self._check_shares(alloc)
        self._timing["scoring"] = self.policy.timing["scoring"]
        self._timing["allocation"] = self.policy.timing["allocation"]
        return rows, alloc

    def _check_shares(self, alloc: np.ndarray) -> None:
        """Refuse an allocation that gives a worker more than its policy states: the caches hold only that."""
        share = self.policy.largest_share(len(alloc), self.state.n_workers)
        counts = np.bincount(alloc, minlength=self.state.n_workers)
        if counts.max() > share:
            worker = int(counts.argmax())
            raise SchedulerError(f"{type(self.policy).__name__} gave worker {worker} {counts[worker]} of "
                                 f"{len(alloc)} samples, more than the {share} its largest_share states "
                                 f"(the caches are sized for that)")

    def _snapshot(self) -> Optional[dict]:
        """The state as ``snapshot_worker`` must see it when this iteration ends (the thread runs ahead)."""
        if self.snapshot_worker is None:
            return None
        holders = self.state.holder_sets()
        w = self.snapshot_worker
        return {"at_ps": holders[:, 0].copy(), "fresh": holders[:, w + 1].copy(),
                "cache_rows": self.state.cache_rows(w)}

    def _trained(self) -> Optional[tuple]:
        """The focus worker's needs and train events, read before ``plan`` overwrites them."""
        if self.state.focus < 0:
            return None
        sends = self.state.p2p_sends(self.state.focus) if self.state.p2p else None
        return (self.state.focus_needs(), self.state.worker_events(self.state.focus), self.state.accumulate_rounds,
                sends)

    def _work(self, trained: Optional[tuple], shared: Optional[np.ndarray]) -> Optional[WorkerPlan]:
        if trained is None:
            return None
        (samples, index, rows, slots), events, rounds, sends = trained
        plan_push = self.state.worker_events(self.state.focus)["plan_push"]
        self._let_the_loop_run()
        pull = events["pull"]
        early = pull["early"]
        return WorkerPlan(
            samples=samples, index=index, rows=rows, slots=slots, local=events["local"]["pairs"],
            accumulate=events["accumulate"]["pairs"], full_set=events["full_set_push"]["pairs"],
            writeback=Transfer(events["writeback"]["rows"], events["writeback"]["slots"]),
            pull=Transfer(pull["rows"][~early], pull["slots"][~early]),
            prefetch=Transfer(pull["rows"][early], pull["slots"][early]),
            plan_push=Transfer(plan_push["rows"], plan_push["slots"]),
            accumulate_turns=events["accumulate"]["turns"], accumulate_rounds=rounds,
            p2p_in=PeerTransfer(events["p2p"]["peers"], events["p2p"]["rows"], events["p2p"]["slots"]),
            p2p_out=PeerTransfer.empty() if sends is None else
            PeerTransfer(sends["receivers"], sends["rows"], sends["slots"]),
            stale=StaleShare.of(events) if self.state.staleness >= 0 else None, shared=shared)

    def save_arrays(self) -> dict:
        """What the plans after the one last yielded depend on, as arrays (docs/design.md section 13).

        Call it while :meth:`plans` waits at a yield (plan ``t``): the cluster
        state after ``plan(t)``, the policy's own state and the allocation of
        ``t + 1``, made before plan ``t`` was handed out. Every worker's
        scheduler holds the same; :meth:`plans` with ``resume`` continues from it.
        """
        step, alloc = self._next
        arrays = {f"state.{k}": v for k, v in self.state.save_arrays().items()}
        arrays.update({f"policy.{k}": v for k, v in self.policy.save_arrays().items()})
        arrays["next_step"] = np.int64(step)
        arrays["next_alloc"] = np.zeros(0, np.int32) if alloc is None else alloc.copy()
        return arrays

    def _restore(self, arrays: dict, rows: np.ndarray) -> tuple[int, np.ndarray]:
        """Load :meth:`save_arrays`; returns the step and allocation of the batch ``rows``."""
        self.state.load_arrays({k[len("state."):]: v for k, v in arrays.items() if k.startswith("state.")})
        self.policy.load_arrays({k[len("policy."):]: v for k, v in arrays.items() if k.startswith("policy.")})
        alloc = np.ascontiguousarray(arrays["next_alloc"], dtype=np.int32)
        if len(alloc) != len(rows):
            raise ValueError(f"the saved allocation covers {len(alloc)} samples, the batch to resume with "
                             f"{len(rows)}")
        return int(arrays["next_step"]), alloc

    def plans(self, batches: Iterable[np.ndarray], resume: Optional[dict] = None,
              start_step: int = 0) -> Iterator[BatchPlan]:
        """One plan per batch of per-table ids ([B, tables]), in order, numbered from ``start_step``.

        ``resume`` (from :meth:`save_arrays`) continues an earlier run: then
        ``batches`` start at the batch of its ``next_step``.
        """
        stream = BatchStream(batches, self.policy.reads_ahead)
        first = stream.next()
        if first is None:
            return
        if resume is None:
            step, (rows, alloc) = start_step, self._allocate(stream, first, start_step)
        else:
            rows = self.global_rows(first)
            step, alloc = self._restore(resume, rows)
            resume = None  # loaded: let the caller's copy go
        self.state.set_needs(rows, alloc)
        while True:
            timing = dict(self._timing)
            start = time.perf_counter()
            counts = self.state.train()
            parts = {"train": time.perf_counter() - start}
            if self.observe is not None:
                self.observe("train")
            per_worker = self.state.worker_transmissions()
            train_digest = self.state.event_digest
            self._let_the_loop_run()
            trained = self._trained()
            timing["state_update"] = time.perf_counter() - start
            parts["update, the rest"] = timing["state_update"] - parts["train"]
            self._let_the_loop_run()
            upcoming = stream.next()
            self._let_the_loop_run()
            if upcoming is not None:
                next_rows, next_alloc = self._allocate(stream, upcoming, step + 1)
                self._let_the_loop_run()
            else:
                next_rows = next_alloc = None
            start = time.perf_counter()
            planned = self.state.plan(next_rows, next_alloc)
            parts["needs"] = self.state.needs_seconds
            parts["pushes"] = time.perf_counter() - start - parts["needs"]
            if self.observe is not None:
                self.observe("plan")
            per_worker += self.state.worker_transmissions()
            digest = array_digest(alloc, train_digest, self.state.event_digest)
            shared = shared_rows(rows, alloc, self.state.n_workers) if self.sums_shared_rows else None
            self._let_the_loop_run()
            work = self._work(trained, shared)
            timing["plan"] = time.perf_counter() - start
            parts["plan, the rest"] = timing["plan"] - parts["needs"] - parts["pushes"]
            self._let_the_loop_run()
            counts = {k: counts[k] + planned[k] for k in KIND_NAMES} | dict.fromkeys(EXTRA_KINDS, 0)
            if shared is not None:
                counts["shared_allreduce"] = len(shared)
            self._next = (step + 1, next_alloc)
            yield BatchPlan(step=step, allocation=alloc, counts=counts, timing=timing,
                            digest=f"{digest:016x}", work=work, snapshot=self._snapshot(),
                            per_worker=per_worker, parts=parts)
            if upcoming is None:
                return
            alloc, rows = next_alloc, next_rows
            step += 1
