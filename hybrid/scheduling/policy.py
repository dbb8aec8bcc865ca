"""What a mode asks of the scheduler: an allocation and a synchronization rule (docs/design.md section 7).

A mode is two scheduling choices, not a loop of its own:

- **allocation**: which worker trains each sample of a global batch
  (seeded random, LAIA, contiguous shards, or FAE's hot and cold batches);
- **synchronization**: how the cluster state moves embedding rows between
  the PS and the caches, which fixes the events the runtime executes and
  the simulator counts (full-set pushes, on-demand plans over the PS or
  peer to peer, HET's staleness clocks, FAE's replicated hot rows).

Each mode module (``hybrid.modes``) names its pair as a
:class:`SchedulePolicy`; the scheduler builds its allocation policy and
cluster state from it.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from hybrid._ext.cluster_state import ClusterState
from hybrid.config import Config, LaiaOrder, LaiaScoring, LaiaVariant, SyncMode
from hybrid.scheduling.allocation import (
    AdaptiveLaiaAllocation, AllocationPolicy, ContiguousAllocation, LaiaAllocation, RandomAllocation,
)


class SchedulerError(ValueError):
    """The scheduler cannot run this configuration (e.g. a mode asked for what it cannot do)."""


class Allocation(str, enum.Enum):
    balanced = "seeded random, balanced"
    laia = "LAIA"
    contiguous = "contiguous shards per worker"
    hot_cold = "FAE's hot and cold mini-batches"


class Sync(str, enum.Enum):
    full_set = "every trained row pushed each iteration"
    on_demand = "on-demand plan (PS or peer to peer)"
    het_clocks = "HET's staleness-bounded cache"
    fae_replicas = "hot rows replicated, cold rows through the PS"


@dataclass(frozen=True)
class SchedulePolicy:
    """One mode's allocation and synchronization choices, and how the scheduler is built from them."""

    allocation: Allocation
    sync: Sync

    def check(self, config: Config) -> None:
        """Raise :class:`SchedulerError` when LAIA's settings in ``config`` contradict one another."""
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

    def label_settings(self, config: Config) -> list[str]:
        """This allocation's settings that differ from the paper's, as a run's label names them (``cost``)."""
        if self.allocation is not Allocation.laia:
            return []
        sched = config.scheduler
        return [name for name, used in (
            (sched.laia.value, sched.laia is not LaiaVariant.exact), ("cost", sched.scoring is LaiaScoring.cost),
            ("confident", sched.order is LaiaOrder.confident), (f"swap{sched.swap_rounds}", sched.swap_rounds > 0),
            ("lookahead", sched.lookahead), (f"blocks{sched.blocks}x{sched.block_size}", sched.blocks > 1)) if used]

    def cluster_state(self, config: Config, *, n_rows: int, capacity: int, max_pairs: int,
                      worker: int | None) -> ClusterState:
        """The cluster state that steps this synchronization (``worker``: the runtime's own)."""
        return ClusterState(n_workers=config.cluster.workers, n_rows=n_rows, capacity=capacity,
                            full_set=self.sync in (Sync.full_set, Sync.fae_replicas), max_pairs=max_pairs,
                            p2p=config.scheduler.sync is SyncMode.p2p, policy=config.cache.policy.value,
                            focus=-1 if worker is None else worker, annotate=worker is not None,
                            staleness=config.scheduler.staleness if self.sync is Sync.het_clocks else -1,
                            threads=config.scheduler.threads)

    def allocation_class(self, config: Config) -> type[AllocationPolicy]:
        """The class of this allocation's policy under ``config`` (known before any state is built)."""
        if self.allocation in (Allocation.balanced, Allocation.hot_cold):  # FAE: random within each hot or cold batch
            return RandomAllocation
        if self.allocation is Allocation.contiguous:
            return ContiguousAllocation
        return AdaptiveLaiaAllocation if config.scheduler.laia is LaiaVariant.adaptive else LaiaAllocation

    def largest_share(self, config: Config) -> int:
        """The most samples of a global batch this allocation gives one worker (what the caches must hold)."""
        return self.allocation_class(config).largest_share(config.global_batch, config.cluster.workers)

    def allocation_policy(self, config: Config, state: ClusterState, cardinalities: np.ndarray) -> AllocationPolicy:
        """This allocation's policy; LAIA reads ``state`` (where rows are cached and fresh)."""
        policy = self.allocation_class(config)
        if policy is RandomAllocation:
            return RandomAllocation(config.cluster.workers, config.seed)
        if policy is ContiguousAllocation:
            return ContiguousAllocation(config.cluster.workers)
        sched = config.scheduler
        choices = {"confident": sched.order is LaiaOrder.confident, "cost": sched.scoring is LaiaScoring.cost,
                   "full_set": self.sync is Sync.full_set, "threads": sched.threads,
                   "swap_rounds": sched.swap_rounds, "lookahead": sched.lookahead, "blocks": sched.blocks,
                   "block_size": sched.block_size}
        if policy is AdaptiveLaiaAllocation:
            return AdaptiveLaiaAllocation(state, config.seed, cardinalities, score_tables=sched.score_tables,
                                          budget_ms=sched.budget_ms, **choices)
        chunks = sched.chunks if sched.laia is LaiaVariant.chunked else None
        return LaiaAllocation(state, config.seed, chunks=chunks, **choices)
