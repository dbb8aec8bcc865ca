"""The plans the scheduler hands to the runtime: what moves, and what one worker executes, in one iteration.

These dataclasses are the whole interface between scheduling and the
training loop (docs/design.md section 11): the loop and the modes read them,
never the cluster state. Every array follows the batch, never the cache.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from hybrid.scheduling.event_kinds import UPDATE_KINDS


@dataclass(frozen=True)
class Transfer:
    """Rows moved between the PS and a worker's cache slots."""

    rows: np.ndarray  # int64 global row ids
    slots: np.ndarray  # int32 cache slots

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(frozen=True)
class PeerTransfer:
    """Rows one worker sends to, or receives from, other workers' caches (P2P; hybrid.runtime.p2p_transport)."""

    peers: np.ndarray  # int32: the receiver of each sent row, or the sender of each received row
    rows: np.ndarray  # int64 global row ids
    slots: np.ndarray  # int32 this worker's cache slots: where sent rows are, or received rows go

    def __len__(self) -> int:
        return len(self.rows)

    @staticmethod
    def empty() -> "PeerTransfer":
        return PeerTransfer(np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int32))


@dataclass(frozen=True)
class StaleShare:
    """HET's part of one worker's iteration (docs/design.md section 7).

    ``checks``: the cached rows whose PS version the worker reads, and the
    version the cluster state says each has (a mismatch is a bug). ``push``:
    positions in the worker's ``rows`` whose unpushed updates, this
    iteration's included, are added to the PS, with ``push_counts`` updates
    each (added to the row's version). ``evicted``: rows evicted with
    unpushed updates, from their slots, ``evicted_counts`` updates each.
    """

    checks: np.ndarray  # int64 rows
    expected: np.ndarray  # int64 versions
    push: np.ndarray
    push_counts: np.ndarray
    evicted: Transfer
    evicted_counts: np.ndarray

    @staticmethod
    def of(events: dict) -> "StaleShare":
        check, push, evicted = events["version_check"], events["delta_push"], events["delta_writeback"]
        return StaleShare(checks=check["rows"], expected=check["versions"], push=push["pairs"],
                          push_counts=push["counts"], evicted=Transfer(evicted["rows"], evicted["slots"]),
                          evicted_counts=evicted["counts"])


@dataclass(frozen=True)
class HotShare:
    """FAE's part of a hot iteration for one worker: its rows are in the replica (slots = replica positions).

    ``union``: replica positions of the distinct rows of the whole global
    batch, sorted, the same on every worker: the hot gradients are summed
    as one ``[len(union), dim]`` allreduce. ``positions``: where this
    worker's rows are in it.
    """

    union: np.ndarray  # int64
    positions: np.ndarray  # int64


@dataclass(frozen=True)
class WorkerPlan:
    """What one worker executes in one iteration. Every array follows the batch, never the cache.

    ``rows``/``slots`` are the distinct rows the worker trains and their cache
    slots; ``index`` maps each of its samples' (sample, table) to a position
    in ``rows``, so embeddings are gathered as ``cache[slots][index]`` and
    their gradients summed per row (``[len(rows), dim]``). ``local``,
    ``accumulate`` and ``full_set`` are positions in ``rows`` by update kind.
    ``accumulate_turns`` gives, per shared row, how many workers before this
    one train it, and ``accumulate_rounds`` the most trainers of any shared
    row (the same on every worker): adding turn 0, then 1, ... with a flush
    and a barrier between them sums each row in worker order.
    ``pull`` must be read after the previous iteration's barrier; ``prefetch``
    rows were not written by the previous iteration, so they may be read
    while it runs (docs/design.md, section 11).
    """

    samples: np.ndarray  # int64 positions of this worker's samples in the global batch
    index: np.ndarray  # int32 [samples, tables]
    rows: np.ndarray
    slots: np.ndarray
    local: np.ndarray
    accumulate: np.ndarray
    full_set: np.ndarray
    writeback: Transfer
    pull: Transfer
    prefetch: Transfer
    plan_push: Transfer
    accumulate_turns: np.ndarray
    accumulate_rounds: int
    p2p_in: PeerTransfer  # rows other workers send this worker at the start of the iteration (P2P mode)
    p2p_out: PeerTransfer  # rows this worker sends them
    stale: Optional[StaleShare] = None  # HET mode
    hot: Optional[HotShare] = None  # FAE mode, hot iterations
    # row-wise Adagrad: every row several workers train in this iteration, sorted, the same on every worker:
    # their gradients are summed over the workers as one [len(shared), dim] allreduce before the update
    shared: Optional[np.ndarray] = None

    def moved_outside_store(self) -> dict:
        """Rows this iteration moves besides the store's: received from peers (P2P), summed with Horovod
        (FAE's hot rows, row-wise Adagrad's shared rows)."""
        summed = (0 if self.hot is None else len(self.hot.union)) + (0 if self.shared is None else len(self.shared))
        return {"p2p": len(self.p2p_in), "allreduced": summed}


@dataclass
class BatchPlan:
    """Iteration ``step``: the global allocation, counts and digest, and one worker's share."""

    step: int
    allocation: np.ndarray  # int32 worker per sample
    counts: dict  # events of train + plan by kind, over all workers
    timing: dict  # seconds: scoring, allocation, state_update, plan
    digest: str  # allocation and every worker's events: equal on every rank
    work: Optional[WorkerPlan] = None  # the scheduler's focus worker's share
    snapshot: Optional[dict] = None  # debug: one worker's view of the state after this iteration
    saved: Optional[dict] = None  # for a checkpoint: Scheduler.save_arrays() after this iteration
    dirty: Optional[tuple] = None  # for a checkpoint or an evaluation: (rows, slots) dirty at the worker after it
    fae: Optional[object] = None  # FAE: what happens before this iteration (hybrid.scheduling.fae_plans.FaeStep)
    per_worker: Optional[np.ndarray] = None  # transmissions of train + plan per worker (pulls, pushes, P2P in)
    # seconds of the state update's and the plan's parts (within timing's stages; hybrid bench scheduler):
    # the state's train(), the rest of the update (the focus worker's events, the digest), the next batch's
    # needs, the plan's pushes, and the rest of the plan (the focus worker's plan)
    parts: dict = field(default_factory=dict)

    @property
    def needed(self) -> int:
        """(worker, row) pairs trained this iteration."""
        return sum(self.counts[k] for k in UPDATE_KINDS)
