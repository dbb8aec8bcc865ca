"""The figures a run reports, from its plans: one definition for ``hybrid train``, ``simulate`` and the benches.

Definitions (docs/design.md section 6):

- a *transmission* is a row that crosses between a worker and a PS rank or
  between two workers: pulls (PS to worker), pushes (worker to PS: Accumulate,
  plan pushes and full-set Puts, eviction write-backs) and P2P rows (a dirty
  row sent straight to the one worker that needs it next);
- a *needed* row is one a worker trains on in an iteration; it is a *hit*
  when it is fresh in that worker's cache and a *miss* when it must be
  fetched: pulled from the PS, or received from a peer (a P2P row is a miss
  too: it was not fresh in the cache that needed it);
- HET's version checks (8-byte reads) and FAE's and row-wise Adagrad's
  allreduced rows are counted apart: they are not transmissions;
- *busiest*: per iteration, the transmissions of the worker with the most,
  summed (the slowest worker sets the pace).

Every figure comes from the plans' event counts, which every rank computes
alike; ``hybrid train`` also measures its rows at the RMA store, and an MPI
test holds the two equal.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hybrid.scheduling.event_kinds import ALLREDUCE_KINDS, CHECK_KINDS, PEER_KINDS, PULL_KINDS, PUSH_KINDS


@dataclass
class Figures:
    """Totals over the plans :meth:`add` was given (one mode, the counted iterations).

    :meth:`add` keeps the totals per event kind; the figures by category
    (pulls, pushes, ...) are summed from them when read. The training loop
    adds every plan, so an addition stays a few dictionary updates.
    """

    iterations: int = 0
    needed: int = 0
    busiest: int = 0  # per iteration, the transmissions of the worker with the most, summed
    by_kind: dict = field(default_factory=dict)
    sched_seconds: dict = field(default_factory=dict)

    def _total(self, kinds) -> int:
        return sum(self.by_kind.get(k, 0) for k in kinds)

    @property
    def pulls(self) -> int:
        return self._total(PULL_KINDS)

    @property
    def pushes(self) -> int:
        return self._total(PUSH_KINDS)

    @property
    def p2p(self) -> int:
        return self._total(PEER_KINDS)

    @property
    def version_checks(self) -> int:
        return self._total(CHECK_KINDS)

    @property
    def allreduced(self) -> int:
        return self._total(ALLREDUCE_KINDS)

    @property
    def fetched(self) -> int:
        """Needed rows that were not fresh in the cache (pulled or sent peer to peer)."""
        return self._total(("pull", "p2p"))

    @property
    def transmissions(self) -> int:
        return self.pulls + self.pushes + self.p2p

    @property
    def hit_rate(self) -> float:
        """Fresh hits / needed rows (FAE: of its cold iterations; the replicas' refills are not misses)."""
        return 1.0 - self.fetched / self.needed if self.needed else 0.0

    @property
    def sched_ms(self) -> float:
        """Scheduling time per batch (scoring + allocation + state update + plan)."""
        return 1000 * sum(self.sched_seconds.values()) / max(1, self.iterations)

    def add(self, plan) -> None:
        self.iterations += 1
        self.needed += plan.needed
        self.busiest += int(plan.per_worker.max()) if plan.per_worker is not None and len(plan.per_worker) else 0
        by_kind = self.by_kind
        for kind, n in plan.counts.items():
            by_kind[kind] = by_kind.get(kind, 0) + n
        sched = self.sched_seconds
        for stage, seconds in plan.timing.items():
            sched[stage] = sched.get(stage, 0.0) + seconds

    def merged(self, other: "Figures") -> "Figures":
        """The figures of both sets of plans (e.g. a run's warm-up iterations and the rest)."""
        def total(a: dict, b: dict) -> dict:
            return {k: a.get(k, 0) + b.get(k, 0) for k in {**a, **b}}
        return Figures(iterations=self.iterations + other.iterations, needed=self.needed + other.needed,
                       busiest=self.busiest + other.busiest, by_kind=total(self.by_kind, other.by_kind),
                       sched_seconds=total(self.sched_seconds, other.sched_seconds))

    def summary(self, timings: bool = True) -> dict:
        """The figures as a dict; without ``timings`` only what the plans' counts give (the same on every run)."""
        figures = {"pulls": self.pulls, "pushes": self.pushes, "p2p": self.p2p,
                   "transmissions": self.transmissions, "version_checks": self.version_checks,
                   "allreduced": self.allreduced, "busiest": self.busiest, "hit_rate": round(self.hit_rate, 6),
                   "iterations": self.iterations, "by_kind": self.by_kind}
        if timings:
            figures["sched_ms"] = round(self.sched_ms, 4)
            figures["sched_ms_by_stage"] = {k: round(1000 * v / max(1, self.iterations), 4)
                                            for k, v in self.sched_seconds.items()}
        return figures
