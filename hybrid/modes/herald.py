"""Herald: location-aware allocation and on-demand plans, over the PS or peer to peer (docs/design.md sections 4-5).

Herald differs from vanilla BSP in two scheduling choices, both made by the
scheduler on every worker alike: LAIA allocates each sample to the worker
whose cache holds most of its rows fresh, and the on-demand plan pushes
only the dirty rows another worker needs in the next iteration. The update
rule is vanilla's (the cluster state marks which rows are local, shared or
plan-pushed). Its two halves run alone for the paper's Table 2 breakdown:
``laia`` (LAIA with full-set synchronization) and ``plan`` (random
allocation with on-demand plans).

With ``scheduler.sync=p2p`` a dirty row needed next by exactly one other
worker goes straight from cache to cache (``hybrid.runtime.p2p_transport``):
the sends start before anything of the iteration lands in the cache, and the
received rows are placed once this worker's write-backs have copied their slots.
"""
from __future__ import annotations

from hybrid.config import Mode, SyncMode
from hybrid.modes.base import WorkerContext
from hybrid.modes.vanilla import Vanilla
from hybrid.scheduling.plans import BatchPlan, WorkerPlan
from hybrid.scheduling.policy import Allocation, SchedulePolicy, Sync


class Herald(Vanilla):
    """LAIA and on-demand plans; rows sent peer to peer with ``scheduler.sync=p2p``."""

    name = Mode.herald
    schedule = SchedulePolicy(Allocation.laia, Sync.on_demand)
    variants = ("scheduler.sync=p2p",)

    def __init__(self, context: WorkerContext):
        super().__init__(context)
        self.peers = None  # the workers' own communicator for rows sent cache to cache (P2P)
        self._exchange = None  # this iteration's started sends and receives
        if self.config.scheduler.sync is SyncMode.p2p:
            self.peers = self.roles.workers.Dup()

    def begin(self, plan: BatchPlan) -> list:
        """P2P: copy out the rows other workers need from this cache and start every send and receive."""
        if self.peers is not None:
            from hybrid.runtime import p2p_transport

            self._exchange = p2p_transport.start(self.peers, self.cache, plan.work.p2p_out, plan.work.p2p_in,
                                                 self.table.wire)
        return []

    def after_reads(self, work: WorkerPlan) -> None:
        """P2P: place the rows received (after the write-backs copied the slots they land in)."""
        if self._exchange is not None:
            self._exchange.complete(self.cache)
            self._exchange = None

    def close(self) -> None:
        if self.peers is not None:
            self.peers.Free()
            self.peers = None


class Laia(Vanilla):
    """Herald's allocation alone: LAIA with full-set synchronization (Table 2)."""

    name = Mode.laia
    schedule = SchedulePolicy(Allocation.laia, Sync.full_set)


class Plan(Herald):
    """Herald's plans alone: random allocation with on-demand synchronization (Table 2)."""

    name = Mode.plan
    schedule = SchedulePolicy(Allocation.balanced, Sync.on_demand)
    variants = ()
