"""The training modes, each one policy of the single training loop (docs/design.md section 7).

A mode is two choices, not a loop of its own:

- **allocation**: which worker trains each sample of a global batch
  (seeded random, LAIA, contiguous shards, or FAE's hot and cold batches);
- **synchronization**: how the cluster state moves embedding rows between
  the PS and the caches, which fixes the events the runtime executes and
  the simulator counts (full-set pushes, on-demand plans over the PS or
  peer to peer, HET's staleness clocks, FAE's replicated hot rows).

:func:`policy_for` gives a mode's :class:`ModePolicy`; the scheduler builds
its allocation policy and cluster state from it, and refuses a config the
mode cannot run before any collective.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from hybrid._ext.cluster_state import ClusterState
from hybrid.scheduling.allocation import (
    AdaptiveLaiaAllocation, AllocationPolicy, ContiguousAllocation, LaiaAllocation, RandomAllocation,
)
from hybrid.config import Config, LaiaOrder, LaiaScoring, LaiaVariant, Mode, SyncMode


class SchedulerError(ValueError):
    """The scheduler cannot run this configuration (e.g. a mode asked for what it cannot do)."""


class Allocation(str, enum.Enum):
    random = "seeded random, balanced"
    laia = "LAIA"
    contiguous = "contiguous shards per worker"
    hot_cold = "FAE's hot and cold mini-batches"


class Sync(str, enum.Enum):
    full_set = "every trained row pushed each iteration"
    on_demand = "on-demand plan (PS or peer to peer)"
    het_clocks = "HET's staleness-bounded cache"
    fae_replicas = "hot rows replicated, cold rows through the PS"


@dataclass(frozen=True)
class ModePolicy:
    """One mode: its allocation and synchronization choices, and how they are built."""

    mode: Mode
    allocation: Allocation
    sync: Sync

    def check(self, config: Config) -> None:
        """Raise :class:`SchedulerError` when this mode cannot run ``config``."""
        if config.scheduler.staleness and self.sync is not Sync.het_clocks:
            raise SchedulerError(f"scheduler.staleness={config.scheduler.staleness} applies to mode het only; "
                                 f"use scheduler.staleness=0 with mode {self.mode.value}")
        if config.scheduler.sync is SyncMode.p2p and self.sync is not Sync.on_demand:
            raise SchedulerError(f"scheduler.sync=p2p needs an on-demand mode (plan or herald), "
                                 f"not {self.mode.value}")
        sequential = {"scheduler.order=confident": config.scheduler.order is LaiaOrder.confident,
                      "scheduler.scoring=cost": config.scheduler.scoring is LaiaScoring.cost}
        for setting, used in sequential.items():
            if used and config.scheduler.laia is LaiaVariant.chunked:
                raise SchedulerError(f"{setting} allocates the whole batch in one sequence: use "
                                     f"scheduler.laia=exact or adaptive, not chunked")
        refinements = {"scheduler.swap_rounds": config.scheduler.swap_rounds,
                       "scheduler.lookahead": config.scheduler.lookahead}
        for setting, value in refinements.items():
            if value and config.scheduler.scoring is not LaiaScoring.cost:
                raise SchedulerError(f"{setting}={value} refines cost scoring's allocation: "
                                     f"add scheduler.scoring=cost")
        if config.scheduler.swap_rounds < 0:
            raise SchedulerError(f"scheduler.swap_rounds must be >= 0, got {config.scheduler.swap_rounds}")
        if self.sync in (Sync.het_clocks, Sync.fae_replicas):
            self._check_unsaved(config)
        if self.sync is Sync.fae_replicas and config.data.test_fraction <= 0:
            raise SchedulerError("scheduler.mode=fae follows the held-out loss between strips: "
                                 "use data.test_fraction > 0")

    def _check_unsaved(self, config: Config) -> None:
        """What HET and FAE do not support yet: each refused by name (docs/design.md section 7)."""
        refused = {"train.checkpoint_every": config.train.checkpoint_every,
                   "train.eval_every": config.train.eval_every,
                   "train.deterministic": config.train.deterministic}
        for key, value in refused.items():
            if value:
                raise SchedulerError(f"{key}={value} is not supported with scheduler.mode={self.mode.value}: "
                                     f"its workers hold updates the PS has not seen (HET's caches, FAE's "
                                     f"replicas), which checkpoints and mid-run evaluations do not carry yet; "
                                     f"use {key}=0 or another mode")

    def cluster_state(self, config: Config, *, n_rows: int, capacity: int, max_pairs: int,
                      worker: int | None) -> ClusterState:
        """The cluster state that steps this mode's synchronization (``worker``: the runtime's own)."""
        return ClusterState(n_workers=config.cluster.workers, n_rows=n_rows, capacity=capacity,
                            full_set=self.sync in (Sync.full_set, Sync.fae_replicas), max_pairs=max_pairs,
                            p2p=config.scheduler.sync is SyncMode.p2p, policy=config.cache.policy.value,
                            focus=-1 if worker is None else worker, annotate=worker is not None,
                            staleness=config.scheduler.staleness if self.sync is Sync.het_clocks else -1)

    def allocation_policy(self, config: Config, state: ClusterState, cardinalities: np.ndarray) -> AllocationPolicy:
        """This mode's allocation policy; LAIA reads ``state`` (where rows are cached and fresh)."""
        if self.allocation in (Allocation.random, Allocation.hot_cold):  # FAE: random within each hot or cold batch
            return RandomAllocation(config.cluster.workers, config.seed)
        if self.allocation is Allocation.contiguous:
            return ContiguousAllocation(config.cluster.workers)
        sched = config.scheduler
        choices = {"confident": sched.order is LaiaOrder.confident, "cost": sched.scoring is LaiaScoring.cost,
                   "full_set": self.sync is Sync.full_set, "threads": sched.threads,
                   "swap_rounds": sched.swap_rounds, "lookahead": sched.lookahead}
        if sched.laia is LaiaVariant.adaptive:
            return AdaptiveLaiaAllocation(state, config.seed, cardinalities, score_tables=sched.score_tables,
                                          budget_ms=sched.budget_ms, **choices)
        chunks = sched.chunks if sched.laia is LaiaVariant.chunked else None
        return LaiaAllocation(state, config.seed, chunks=chunks, **choices)


POLICIES = {
    Mode.vanilla: ModePolicy(Mode.vanilla, Allocation.random, Sync.full_set),
    Mode.laia: ModePolicy(Mode.laia, Allocation.laia, Sync.full_set),
    Mode.plan: ModePolicy(Mode.plan, Allocation.random, Sync.on_demand),
    Mode.herald: ModePolicy(Mode.herald, Allocation.laia, Sync.on_demand),
    Mode.het: ModePolicy(Mode.het, Allocation.contiguous, Sync.het_clocks),
    Mode.fae: ModePolicy(Mode.fae, Allocation.hot_cold, Sync.fae_replicas),
}


def run_label(config: Config) -> str:
    """The mode and, for LAIA modes, the allocation settings that differ from the paper's: ``herald+cost+confident``.

    Runs of one mode with different allocations are told apart by it in
    summaries and ``hybrid compare``.
    """
    sched = config.scheduler
    parts = [sched.mode.value]
    if policy_for(sched.mode).allocation is Allocation.laia:
        parts += [name for name, used in (
            (sched.laia.value, sched.laia is not LaiaVariant.exact), ("cost", sched.scoring is LaiaScoring.cost),
            ("confident", sched.order is LaiaOrder.confident), (f"swap{sched.swap_rounds}", sched.swap_rounds > 0),
            ("lookahead", sched.lookahead)) if used]
    if sched.sync is SyncMode.p2p:
        parts.append("p2p")
    return "+".join(parts)


def policy_for(mode: Mode) -> ModePolicy:
    return POLICIES[mode]
